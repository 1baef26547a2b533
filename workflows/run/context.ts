// What every part of the training run shares within one execution: its config and state, the
// activity proxies, and the flags its concurrent parts (main loop, checkpoint pump, handlers)
// coordinate through. Nothing here survives continue-as-new but `st`.
import type { SearchAttributeUpdatePair } from '@temporalio/common';
import { type ApplicationFailure, upsertSearchAttributes, workflowInfo } from '@temporalio/workflow';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import type { RunConfig } from '../../protocol/run-config.js';
import { controlActivities, gymRecoveryActivities, storageActivities, type Activities } from '../activities-proxy.js';
import type { RunStatus } from '../messages.js';
import { RUN_NAME, RUN_PHASE, TRAINER_STEP } from '../search-attributes.js';
import { ShardAsker } from '../shard-asker.js';
import { totalInFlight, type RunState } from './state.js';

export class RunContext {
  readonly runId = workflowInfo().workflowId;
  readonly startedAtMs = Date.now();
  readonly control: Activities;
  /** Snapshot I/O, the dataset and the trainer: retried until they succeed or fail for good. */
  readonly storage: Activities;
  /** Discovery while a recovery waits for Gym (bounded by `controller.gym_recovery_timeout_s`). */
  readonly gymRecovery: Activities;
  /** Requests to every shard and their answers. */
  readonly shardsAsk: ShardAsker;
  readonly totalGroups: number;
  /** `tiny_grpo`, `none` (collect rollouts for an external trainer) or `external`. */
  readonly trainerKind: RunConfig['trainer']['kind'];
  /** A trainer that keeps weights: refits, anchors, catch-up. `none` keeps none. */
  readonly ownsWeights: boolean;
  /** `snapshot_attempt_interval_s` in ms, or null (no periodic checkpoints). */
  readonly intervalMs: number | null;

  /** Something happened the main loop must look at. */
  changed = false;
  fatal: ApplicationFailure | undefined;
  checkpointRunning = false;
  /** The periodic checkpoint's timer fired (run/checkpoints.ts armCheckpointTimer). */
  checkpointTimerFired = false;
  checkpointTimerSeq = 0;
  /** A trainer anchor was written: its trainer-boundary snapshot comes before the next step. */
  boundaryRequested = false;
  training = false;
  recovering = false;
  /** A recovery waits for Gym to answer: the shards' deadline clocks are held. */
  gymDown = false;
  /** The run is about to continue as new: the shards' reports are held (run/carry.ts). */
  continuingAsNew = false;
  /** Shard reports received in this execution (the carry waits until they stop coming). */
  reportsReceived = 0;
  /** History length before which continue-as-new is not tried again (the state was too large). */
  carryRetryAt = 0;
  manualRequested = 0;
  manualServed = 0;
  manualOutcomes: Record<number, CheckpointOutcome> = {};
  /** Retention after the latest published snapshots (awaited before continue-as-new and the end). */
  retention: Promise<unknown> = Promise.resolve();

  constructor(
    readonly cfg: RunConfig,
    readonly st: RunState,
  ) {
    const placement = { taskQueue: cfg.run.task_queue, scheduleToStartTimeoutS: cfg.controller.schedule_to_start_timeout_s };
    this.control = controlActivities(placement);
    this.storage = storageActivities(placement);
    this.gymRecovery = gymRecoveryActivities(placement, cfg.controller.gym_recovery_timeout_s);
    this.shardsAsk = new ShardAsker(cfg.run.name, () => ++st.requestSeq);
    this.totalGroups = cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step;
    this.trainerKind = cfg.trainer.kind;
    this.ownsWeights = cfg.trainer.enabled && cfg.trainer.kind !== 'none';
    const interval = cfg.rollout_checkpointing.snapshot_attempt_interval_s;
    this.intervalMs = interval === null ? null : interval * 1000;
  }

  wake(): void {
    this.changed = true;
  }

  admissionOpen(): boolean {
    const { st } = this;
    return !st.gates.weightSync && !st.gates.gymCheckpoint && !st.paused && !st.stopRequested && !st.recoveryNeeded;
  }

  /** `withCheckpoint` false: what the run is in apart from a checkpoint in progress. */
  phase(withCheckpoint = true): string {
    const { st } = this;
    if (st.stopRequested) return 'stopping';
    if (st.waitingForGymSince) return 'waiting_for_gym';
    if (this.recovering) return 'recovering';
    if (withCheckpoint && this.checkpointRunning) return 'checkpointing';
    if (st.pendingRelease) return 'release_pending';
    if (st.pendingAbort) return 'abort_pending';
    if (st.paused) return 'paused';
    return 'dispatching';
  }

  /**
   * Run name, phase and step in the workflow list (search attributes), upserted only when one
   * changed: each upsert is a history event and a visibility write. A checkpoint in progress is
   * not a phase there: one every few seconds would write two upserts each.
   */
  showInList(phase = this.phase(false)): void {
    const shown = workflowInfo().typedSearchAttributes;
    const changes: SearchAttributeUpdatePair[] = [];
    if (shown.get(RUN_NAME) !== this.cfg.run.name) changes.push({ key: RUN_NAME, value: this.cfg.run.name });
    if (shown.get(RUN_PHASE) !== phase) changes.push({ key: RUN_PHASE, value: phase });
    if (shown.get(TRAINER_STEP) !== this.st.steps) changes.push({ key: TRAINER_STEP, value: this.st.steps });
    if (changes.length > 0) upsertSearchAttributes(changes);
  }

  status(): RunStatus {
    const { st } = this;
    return {
      run: this.cfg.run.name,
      phase: this.phase(),
      steps: st.steps,
      cursor: st.cursor,
      inFlight: totalInFlight(st),
      completedRollouts: st.completedRollouts,
      failedRollouts: st.failedRollouts,
      gates: { ...st.gates },
      pendingRelease: st.pendingRelease?.checkpointId ?? null,
      pendingAbort: st.pendingAbort?.checkpointId ?? null,
      lastSnapshot: st.lastSnapshot,
      consecutiveFailures: st.consecutiveFailures,
      waitingForGymSince: st.waitingForGymSince,
      checkpoints: st.checkpoints,
      rewardPerStep: st.rewardPerStep,
      continuedAsNew: st.continuedAsNew,
      shards: st.shards,
    };
  }

  /** The Gym deployment's inference backend (the trainer refits it), if it has one. */
  backendUrl(): string | undefined {
    return Object.values(this.st.topology?.servers ?? {}).find((s) => s.kind === 'inference')?.url;
  }
}
