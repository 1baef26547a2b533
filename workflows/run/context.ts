// What every part of the training run shares within one execution: its config and state, the
// activity proxies, and the flags its concurrent parts (main loop, checkpoint pump, handlers)
// coordinate through. Nothing here survives continue-as-new but `st`.
import { ApplicationFailure, workflowInfo } from '@temporalio/workflow';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import type { RunConfig } from '../../protocol/run-config.js';
import { controlActivities, gymProbeActivities, gymRecoveryActivities, storageActivities, storageLocalActivities, type Activities, type LocalActivities } from '../activities-proxy.js';
import type { CheckpointCommitted, CheckpointPrepared, RunStatus } from '../messages.js';
import type { InFlight, RunState } from './state.js';

export class RunContext {
  readonly runId = workflowInfo().workflowId;
  readonly startedAtMs = Date.now();
  readonly control: Activities;
  /** Snapshot I/O, the dataset and the trainer: retried until they succeed or fail for good. */
  readonly storage: Activities;
  /** The ledger cut: a local activity, so the ledger stays out of the history. */
  readonly storageLocal: LocalActivities;
  /** One discovery after live failures, not retried (run/live-failures.ts). */
  readonly gymProbe: Activities;
  /** Discovery while a recovery waits for Gym (bounded by `controller.gym_recovery_timeout_s`). */
  readonly gymRecovery: Activities;
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
  /** The deadline clock ticked past some deadline (run/deadline-clock.ts): signalExpired() looks. */
  expiryDue = false;
  /** The periodic checkpoint's timer fired (run/checkpoints.ts armCheckpointTimer). */
  checkpointTimerFired = false;
  checkpointTimerSeq = 0;
  /** A trainer anchor was written: its trainer-boundary snapshot comes before the next step. */
  boundaryRequested = false;
  training = false;
  recovering = false;
  manualRequested = 0;
  manualServed = 0;
  manualOutcomes: Record<number, CheckpointOutcome> = {};
  /** The attempt's requests for the ledger cut (checkpointPrepared, checkpointCommitted). */
  earlyCutRequest: CheckpointPrepared | undefined;
  cutRequest: CheckpointCommitted | undefined;
  /** Retention after the latest published snapshots (awaited before continue-as-new and the end). */
  retention: Promise<unknown> = Promise.resolve();
  /** In-flight attempts whose cohort started over without them: told to stop (run/reports.ts). */
  toStop: InFlight[] = [];

  constructor(
    readonly cfg: RunConfig,
    readonly st: RunState,
  ) {
    const placement = { taskQueue: cfg.run.task_queue, scheduleToStartTimeoutS: cfg.controller.schedule_to_start_timeout_s };
    this.control = controlActivities(placement);
    this.storage = storageActivities(placement);
    this.storageLocal = storageLocalActivities();
    this.gymProbe = gymProbeActivities(placement);
    this.gymRecovery = gymRecoveryActivities(placement, cfg.controller.gym_recovery_timeout_s);
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

  phase(): string {
    const { st } = this;
    if (st.stopRequested) return 'stopping';
    if (st.waitingForGymSince) return 'waiting_for_gym';
    if (this.recovering) return 'recovering';
    if (this.checkpointRunning) return 'checkpointing';
    if (st.pendingRelease) return 'release_pending';
    if (st.pendingAbort) return 'abort_pending';
    if (st.paused) return 'paused';
    return 'dispatching';
  }

  status(): RunStatus {
    const { st } = this;
    return {
      run: this.cfg.run.name,
      phase: this.phase(),
      steps: st.steps,
      cursor: st.ledger.cursor,
      inFlight: Object.keys(st.inFlight).length,
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
    };
  }

  /** The Gym deployment's inference backend (the trainer refits it), if it has one. */
  backendUrl(): string | undefined {
    return Object.values(this.st.topology?.servers ?? {}).find((s) => s.kind === 'inference')?.url;
  }
}
