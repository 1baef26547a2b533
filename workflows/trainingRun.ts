// The training run (workflow ID = run name). It owns the ledger, the two admission gates, the
// rollout deadlines, dispatch, the checkpoint pump and training-step consumption; its event history
// is the controller's durable memory. Rollout and checkpoint attempts are child workflows.
import {
  ActivityFailure,
  ApplicationFailure,
  ParentClosePolicy,
  allHandlersFinished,
  condition,
  continueAsNew,
  getExternalWorkflowHandle,
  isCancellation,
  log,
  patched,
  sleep,
  setCurrentDetails,
  setHandler,
  startChild,
  upsertMemo,
  uuid4,
  workflowInfo,
} from '@temporalio/workflow';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import type { TrainBatch } from '../activities/trainer.js';
import type { CheckpointOutcome, CheckpointTrigger, GymTopology, RolloutReport } from '../protocol/controller.js';
import { captureKey, type CaptureKey, type EpisodeId } from '../protocol/episode-id.js';
import type { RunConfig } from '../protocol/run-config.js';
import { controlActivities, gymRecoveryActivities, storageActivities, storageLocalActivities } from './activities-proxy.js';
import { checkpointAttempt, checkpointWorkflowId, TAKE_EARLY_CUT } from './checkpointAttempt.js';
import * as D from './deadlines.js';
import { describeFailure, unreachableServers } from './failures.js';
import * as L from './ledger.js';
import { checkLedger } from './ledger-invariants.js';
import { isPackedJson, packJson, unpackJson, unpacked, type PackedJson } from '../protocol/packed-json.js';
import { resolveLevels, TargetLevelError, type EnvironmentCapabilities, type EnvironmentLevel } from './target-levels.js';
import {
  checkpointCommitted,
  checkpointPrepared,
  checkpointNow,
  deadlineExpired,
  stopAttempt,
  earlyLedgerCutWritten,
  ledgerCutWritten,
  pauseRun,
  resumeRun,
  rolloutFinished,
  runStatus,
  stopRun,
  type CheckpointCommitted,
  type CheckpointPrepared,
  type LedgerCutWritten,
  type LegacyCheckpointCommitted,
  type RunStatus,
} from './messages.js';
import { GYM_RESTARTED, rolloutAttempt, rolloutWorkflowId } from './rolloutAttempt.js';

export interface InFlight {
  episode: EpisodeId;
  groupId: string;
  environment: string;
  workflowId: string;
  /** Told to stop (its deadline expired, or its cohort started over without it): signalled once. */
  stopSignalled: boolean;
}

export interface RunState {
  ledger: L.Ledger;
  topology: GymTopology | null;
  deadlines: D.DeadlineRegistry;
  inFlight: Record<CaptureKey, InFlight>;
  /** true = closed. Neither owner reopens the other's gate (controller.md §1.1). */
  gates: { weightSync: boolean; gymCheckpoint: boolean };
  pendingRelease: { checkpointId: string; snapshotDir: string; trigger: CheckpointTrigger } | null;
  pendingAbort: { checkpointId: string; trigger: CheckpointTrigger } | null;
  lastSnapshot: string | null;
  consecutiveFailures: number;
  checkpoints: CheckpointOutcome[];
  steps: number;
  trainerVersion: number;
  rewardPerStep: number[];
  completedRollouts: number;
  failedRollouts: number;
  /** Reports received and not yet applied (carried across continue-as-new). */
  reports: RolloutReport[];
  /** Rollouts finished for good, to `forget` in Gym. */
  forgetQueue: string[];
  lastCheckpointAtMs: number | null;
  checkpointSeq: number;
  continuedAsNew: number;
  paused: boolean;
  stopRequested: boolean;
  /** Batches trained since the newest trainer anchor (re-sent when the trainer lost its state). */
  trainedBatches: Array<{ step: number; expectedVersion: number; batch: TrainBatch; cursor: number }>;
  /** Step of the newest durable trainer anchor (0: bootstrap). */
  lastAnchorStep: number;
  /** Capture keys the last published snapshot continues (its Gym scope). */
  lastSnapshotScope: CaptureKey[];
  /** A Gym process restarted under in-flight attempts: restore and redispatch before new work. */
  recoveryNeeded: boolean;
  /** Since when a recovery waits for Gym to answer again (ISO time); absent or null when it does not. */
  waitingForGymSince?: string | null;
  recoveries: RecoveryRecord[];
  /** What a cold `restore_mode: latest` start took over (null: started fresh, or a warm run). */
  restoredFrom?: RestoredFrom | null;
  /** The step whose missing trainer anchor was already reported (log once per step). */
  missingAnchorStep: number | null;
  /** Per environment (`recovery_granularity`, `restore_level`), resolved once at setup from discovery. */
  levels: Record<string, EnvironmentLevel> | null;
  /** One per environment whose level was lowered (controller.md §5.6 rule 2). */
  levelWarnings: string[];
}

export interface RestoredFrom {
  /** `step_<N>` or null (no trainer anchor: the trainer is off, or none was written yet). */
  anchor: string | null;
  /** The snapshot restored, or null for the anchor's Gym-restart fallback (no Gym state). */
  snapshotDir: string | null;
  step: number;
  trainerVersion: number;
  /** Newer snapshots that did not validate and were passed over. */
  skipped: Array<{ dir: string; reason: string }>;
}

export interface RecoveryRecord {
  at: string;
  restoreId: string | null;
  snapshotDir: string | null;
  continued: CaptureKey[];
  restarted: CaptureKey[];
  error?: string;
}

export interface TrainingRunInput {
  config: RunConfig;
  /** Carried across continue-as-new: packed (see `packRunState`); a plain state is accepted too. */
  state?: RunState | PackedJson;
}

/** The compact form of `RunState.inFlight`: one row per attempt, derivable fields left out. */
type PackedInFlight = Array<
  | [rolloutId: string, attempt: number, environment: string, stopSignalled: boolean]
  | [rolloutId: string, attempt: number, environment: string, stopSignalled: boolean, key: string, groupId: string, workflowId: string]
>;

/**
 * The run state as continue-as-new carries it. The input is a single payload, limited to 2 MiB
 * (a larger one fails the workflow task on every retry: the run would replay its whole history
 * forever without progress). Plain JSON costs ~530 bytes per rollout in flight (over the limit at
 * ~4,000); packed, with the in-flight entries reduced to what the ledger and IDs do not already
 * say, it is ~130 bytes.
 */
export function packRunState(st: RunState, run: string): PackedJson {
  const inFlight: PackedInFlight = Object.entries(st.inFlight).map(([key, f]) => {
    const e = f.episode;
    const derived = captureKey(e) === key && f.groupId === L.groupIdOfRollout(e.rollout_id) && f.workflowId === rolloutWorkflowId(run, e);
    return derived
      ? [e.rollout_id, e.attempt, f.environment, f.stopSignalled]
      : [e.rollout_id, e.attempt, f.environment, f.stopSignalled, key, f.groupId, f.workflowId];
  });
  return packJson({ ...st, inFlight });
}

export function unpackRunState(p: PackedJson, run: string): RunState {
  const raw = unpackJson<Omit<RunState, 'inFlight'> & { inFlight: PackedInFlight }>(p);
  const inFlight: Record<CaptureKey, InFlight> = {};
  for (const row of raw.inFlight) {
    const [rollout_id, attempt, environment, stopSignalled] = row;
    const episode: EpisodeId = { rollout_id, attempt };
    const key = row.length === 7 ? row[4] : captureKey(episode);
    inFlight[key] = {
      episode,
      groupId: row.length === 7 ? row[5] : L.groupIdOfRollout(rollout_id),
      environment,
      workflowId: row.length === 7 ? row[6] : rolloutWorkflowId(run, episode),
      stopSignalled,
    };
  }
  return { ...raw, inFlight };
}

/** Continue-as-new input above this (bytes of JSON) is not sent: the run keeps its history instead. */
const MAX_CARRIED_STATE_BYTES = 1_500_000;

export interface RunSummary {
  run: string;
  steps: number;
  rewardPerStep: number[];
  completedRollouts: number;
  failedRollouts: number;
  checkpoints: CheckpointOutcome[];
  lastSnapshot: string | null;
  continuedAsNew: number;
  recoveries: RecoveryRecord[];
  trainerVersion: number;
  restoredFrom: RestoredFrom | null;
}

const GYM_HOLDER = 'gym-checkpoint';
const WEIGHT_SYNC_HOLDER = 'weight-sync';
const RECOVERY_HOLDER = 'gym-recovery';
const MAX_KEPT_OUTCOMES = 50;
const FORGET_BATCH = 64;
const LOAD_BATCH_GROUPS = 64;
const MAX_STARTS_PER_TASK = 250;

export function initialState(config: RunConfig): RunState {
  return {
    ledger: L.emptyLedger(config.run.name),
    topology: null,
    deadlines: D.emptyDeadlines(),
    inFlight: {},
    gates: { weightSync: false, gymCheckpoint: false },
    pendingRelease: null,
    pendingAbort: null,
    lastSnapshot: null,
    consecutiveFailures: 0,
    checkpoints: [],
    steps: 0,
    trainerVersion: 0,
    rewardPerStep: [],
    completedRollouts: 0,
    failedRollouts: 0,
    reports: [],
    forgetQueue: [],
    lastCheckpointAtMs: null,
    checkpointSeq: 0,
    continuedAsNew: 0,
    paused: false,
    stopRequested: false,
    trainedBatches: [],
    lastAnchorStep: 0,
    lastSnapshotScope: [],
    recoveryNeeded: false,
    recoveries: [],
    missingAnchorStep: null,
    levels: null,
    levelWarnings: [],
  };
}

/** What an attempt that signalled the committed keys (not `unsettled`) means by it. */
function legacyUnsettled(req: LegacyCheckpointCommitted, atStart: ReadonlySet<CaptureKey>): CaptureKey[] {
  const settled = new Set([...req.environmentKeys, ...req.restarts]);
  return [...atStart].filter((k) => !settled.has(k));
}


/** Patch: the run applies retention after the attempt's outcome, with admission open again. */
const RETENTION_BY_RUN = 'retention-by-run';

/** Patch: the ledger cut became a local activity; runs recorded before it replay the regular one. */
const LEDGER_CUT_LOCAL = 'ledger-cut-local-activity';

export async function trainingRun(input: TrainingRunInput): Promise<RunSummary> {
  const cfg = input.config;
  const st = input.state === undefined ? initialState(cfg) : isPackedJson(input.state) ? unpackRunState(input.state, cfg.run.name) : input.state;
  const runId = workflowInfo().workflowId;
  const control = controlActivities(cfg.run.task_queue);
  const storage = storageActivities(cfg.run.task_queue);
  const trainer = storageActivities(cfg.run.task_queue);
  // `none` (collect rollouts for an external trainer) keeps no weights: no refit, no anchors. Absent in configs parsed before the setting existed.
  const trainerKind = cfg.trainer.kind ?? 'tiny_grpo';
  const ownsWeights = cfg.trainer.enabled && trainerKind !== 'none';
  const storageLocal = storageLocalActivities();
  // Absent in configs parsed before the setting existed.
  const gymRecoveryTimeoutS = cfg.controller.gym_recovery_timeout_s ?? 600;
  const gymRecovery = gymRecoveryActivities(cfg.run.task_queue, gymRecoveryTimeoutS);
  let recovering = false;
  /** Retention applied after the latest published snapshots (awaited before continue-as-new and the end). */
  let retention: Promise<unknown> = Promise.resolve();
  const totalGroups = cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step;
  const intervalMs = cfg.rollout_checkpointing.snapshot_attempt_interval_s === null ? null : cfg.rollout_checkpointing.snapshot_attempt_interval_s * 1000;

  let changed = false;
  const wake = (): void => {
    changed = true;
  };
  let cutRequest: CheckpointCommitted | LegacyCheckpointCommitted | undefined;
  let earlyCutRequest: CheckpointPrepared | undefined;
  let checkpointRunning = false;
  let boundaryRequested = false;
  let manualRequested = 0;
  let manualServed = 0;
  const manualOutcomes: Record<number, CheckpointOutcome> = {};
  let fatal: ApplicationFailure | undefined;
  /** History length before which continue-as-new is not tried again (the state was too large). */
  let carryRetryAt = 0;

  setHandler(rolloutFinished, (r) => {
    st.reports.push(r);
    wake();
  });
  setHandler(checkpointCommitted, (c) => {
    cutRequest = c;
    wake();
  });
  setHandler(checkpointPrepared, (c) => {
    earlyCutRequest = c;
    wake();
  });
  setHandler(pauseRun, () => {
    st.paused = true;
    wake();
  });
  setHandler(resumeRun, () => {
    st.paused = false;
    wake();
  });
  setHandler(stopRun, () => {
    st.stopRequested = true;
    wake();
  });
  setHandler(runStatus, (): RunStatus => status());
  setHandler(checkpointNow, async () => {
    const ticket = ++manualRequested;
    wake();
    await condition(() => manualOutcomes[ticket] !== undefined);
    const o = manualOutcomes[ticket]!;
    delete manualOutcomes[ticket];
    return o;
  });

  function status(): RunStatus {
    return {
      run: cfg.run.name,
      phase: phase(),
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
      waitingForGymSince: st.waitingForGymSince ?? null,
      checkpoints: st.checkpoints,
      rewardPerStep: st.rewardPerStep,
      continuedAsNew: st.continuedAsNew,
    };
  }

  function phase(): string {
    if (st.stopRequested) return 'stopping';
    if (st.waitingForGymSince) return 'waiting_for_gym';
    if (recovering) return 'recovering';
    if (checkpointRunning) return 'checkpointing';
    if (st.pendingRelease) return 'release_pending';
    if (st.pendingAbort) return 'abort_pending';
    if (st.paused) return 'paused';
    return 'dispatching';
  }

  const admissionOpen = (): boolean =>
    !st.gates.weightSync && !st.gates.gymCheckpoint && !st.paused && !st.stopRequested && !st.recoveryNeeded;

  // --- results -----------------------------------------------------------------------------

  function applyReports(): void {
    const reports = st.reports;
    st.reports = [];
    for (const r of reports) {
      const key = captureKey(r.episode);
      const flight = st.inFlight[key];
      delete st.inFlight[key];
      D.removeDeadline(st.deadlines, key);
      if (r.status === 'completed' && r.reward !== null) {
        const sealed = L.sealAttempt(st.ledger, r.episode, r.reward, false);
        if (sealed === 'sealed') st.completedRollouts += 1;
        continue;
      }
      // A failed, timed-out or retired attempt (already retired by its workflow): start the
      // sibling (or its whole group) over as the next attempt, within the attempt budget.
      void flight;
      const found = L.findSibling(st.ledger, r.episode.rollout_id);
      if (!found || L.currentAttempt(found.sibling).gym_attempt !== r.episode.attempt) continue;
      if (r.reason === GYM_RESTARTED) {
        // Not the attempt's fault: the Gym process under it restarted. Recovery decides whether
        // it continues from the last snapshot (N+1) or starts over; it stays `dispatched` until then.
        st.recoveryNeeded = true;
        continue;
      }
      st.failedRollouts += 1;
      const attemptsSoFar = found.sibling.attempts.length;
      if (attemptsSoFar >= cfg.async_rl.max_attempts_per_sibling || r.terminal) {
        // Give up on this sibling: a masked zero-reward placeholder keeps its group trainable.
        L.sealAttempt(st.ledger, r.episode, 0, true);
        log.warn('sibling gave up', { key, reason: r.reason });
      } else {
        const affected = L.failAttempt(st.ledger, r.episode, r.reason ?? r.status);
        // A cohort that starts over together: its members still running are stopped (retired,
        // caller first, by their own workflows), not left waiting in /verify for a cohort that
        // will never form again (they would hold recovery and the run's end until its timeout).
        for (const s of affected) {
          const prev = s === found.sibling ? undefined : s.attempts[s.attempts.length - 2];
          const flight = prev && st.inFlight[captureKey(L.episodeOfAttempt(s, prev))];
          if (flight && !flight.stopSignalled) toStop.push(flight);
        }
      }
    }
  }

  // --- training steps ------------------------------------------------------------------------

  let training = false;

  /** The trajectory of each sibling: its reward and the attempts whose model calls it used. */
  function batchOf(groups: L.PromptGroup[]): TrainBatch {
    return groups.map((g) => ({
      group_id: g.group_id,
      siblings: g.siblings.map((s) => {
        const a = L.currentAttempt(s);
        return { rollout_id: s.rollout_id, reward: a.reward ?? 0, mask: a.mask_sample ?? true, captureKeys: L.lineageKeys(s) };
      }),
    }));
  }

  function backendUrl(): string | undefined {
    return Object.values(st.topology?.servers ?? {}).find((s) => s.kind === 'inference')?.url;
  }

  function sendBatch(step: number, version: number, batch: TrainBatch, cursor: number) {
    const url = backendUrl();
    if (!url && trainerKind === 'tiny_grpo') throw ApplicationFailure.nonRetryable('the Gym deployment has no inference server to refit', 'invariant_error');
    return trainer.trainStep.executeWithOptions({ summary: trainerKind === 'none' ? `rollout batch of step ${step}` : `${trainerKind === 'tiny_grpo' ? 'GRPO' : 'training'} step ${step} (policy v${version} → v${version + 1})` }, [
      { run: cfg.run.name, checkpointDir: cfg.run.checkpoint_dir, trainer: trainerKind, ...(url ? { backendUrl: url } : {}), gymRunDir: cfg.run.gym_run_dir, expectedVersion: version, step, batch, cursor },
    ]);
  }

  /**
   * Runs a trainer call; when the trainer lost its in-memory state (a worker restart), it comes back
   * from its newest anchor and says so (`trainer_behind`): redo the steps after that anchor from the
   * batches this run kept, then try again.
   */
  async function withTrainerCatchUp<T>(fn: () => Promise<T>): Promise<T> {
    for (let tries = 0; ; tries++) {
      try {
        return await fn();
      } catch (err) {
        const f = err instanceof ActivityFailure ? err.cause : undefined;
        if (!(f instanceof ApplicationFailure) || f.type !== 'trainer_behind' || tries > 1) throw err;
        const have = (f.details?.[0] as { step?: number } | undefined)?.step ?? 0;
        log.warn('trainer lost its state; replaying the batches after its anchor', { anchorStep: have });
        for (const t of st.trainedBatches.filter((b) => b.step > have)) await sendBatch(t.step, t.expectedVersion, t.batch, t.cursor);
      }
    }
  }

  async function trainStep(step: number, batch: TrainBatch, cursor: number): Promise<void> {
    const r = await withTrainerCatchUp(() => sendBatch(step, st.trainerVersion, batch, cursor));
    st.trainerVersion = r.version;
  }

  async function trainReadyGroups(): Promise<void> {
    // A snapshot is bound to one trainer step: no step advances while a checkpoint is in progress.
    if (checkpointRunning || training) return;
    training = true;
    try {
      for (;;) {
        // An anchor's trainer-boundary snapshot is taken at its step, before the next step trains.
        if (checkpointRunning || boundaryRequested) return;
        const ready = L.readyGroups(st.ledger);
        if (ready.length < cfg.grpo.num_prompts_per_step || st.steps >= cfg.grpo.max_num_steps) return;
        const groups = ready.slice(0, cfg.grpo.num_prompts_per_step);
        const batch = batchOf(groups);
        const live = batch.flatMap((g) => g.siblings).filter((x) => !x.mask);
        const mean = live.length ? live.reduce((a, x) => a + x.reward, 0) / live.length : 0;
        const step = st.steps + 1;
        if (cfg.trainer.enabled) {
          // Weight sync: admission closed by its own gate (the checkpoint gate is not touched).
          st.gates.weightSync = true;
          D.hold(st.deadlines, WEIGHT_SYNC_HOLDER, Date.now());
          try {
            await trainStep(step, batch, st.ledger.cursor);
          } finally {
            st.gates.weightSync = false;
            D.release(st.deadlines, WEIGHT_SYNC_HOLDER, Date.now());
          }
        }
        for (const g of groups) {
          L.consumeGroup(st.ledger, g.group_id);
          st.forgetQueue.push(...L.rolloutIds(g));
        }
        st.steps = step;
        st.rewardPerStep.push(mean);
        // Kept to re-send to a trainer that lost its state; one that keeps none is never re-sent anything.
        if (ownsWeights) st.trainedBatches.push({ step, expectedVersion: st.trainerVersion - 1, batch, cursor: st.ledger.cursor });
        log.info('training step', { step, reward: mean, policyVersion: st.trainerVersion });
        await upsertMemo({ steps: st.steps, policyVersion: st.trainerVersion });
        if (ownsWeights && cfg.checkpointing.enabled && (step % cfg.checkpointing.save_period === 0 || step === cfg.grpo.max_num_steps)) {
          await saveTrainerAnchor(step);
        }
      }
    } finally {
      // No wake() here: the main loop calls this every pass, and waking it would spin forever.
      training = false;
    }
  }

  /**
   * Trainer anchor durable → fallback marker → a Gym-aware snapshot at that anchor (controller.md
   * §2.6). Anchor and marker are one activity, so a run lost between them cannot leave an anchor
   * that a cold start must refuse.
   */
  async function saveTrainerAnchor(step: number): Promise<void> {
    const gymRestartFallback = { topologyFingerprint: st.topology?.fingerprint ?? '', ledger: packJson(st.ledger) };
    await withTrainerCatchUp(() =>
      trainer.saveTrainerCheckpoint.executeWithOptions({ summary: `trainer checkpoint step_${step} and its Gym-restart fallback` }, [
        { run: cfg.run.name, checkpointDir: cfg.run.checkpoint_dir, step, cursor: st.ledger.cursor, gymRestartFallback },
      ]),
    );
    st.lastAnchorStep = step;
    // The batches before the anchor are in it now.
    st.trainedBatches = st.trainedBatches.filter((b) => b.step > step);
    boundaryRequested = true;
  }

  // --- dispatch ------------------------------------------------------------------------------

  async function dispatch(): Promise<void> {
    if (!admissionOpen() || !st.topology) return;
    // Keep `max_in_flight_groups` unfinished groups reserved.
    const unfinished = L.unfinishedGroupCount(st.ledger);
    const want = Math.min(cfg.async_rl.max_in_flight_groups - unfinished, totalGroups - st.ledger.cursor);
    if (want > 0) {
      // Bounded batches: an activity result stays far below Temporal's payload limits.
      const loaded = await storage.loadPromptGroups({
        seed: cfg.run.seed,
        cursor: st.ledger.cursor,
        groups: Math.min(want, LOAD_BATCH_GROUPS),
        groupSize: cfg.grpo.num_generations_per_prompt,
        tasksets: cfg.grpo.tasksets,
      });
      if (loaded.groups.length < want) wake();
      for (const g of loaded.groups) {
        const environment = cfg.grpo.environments[g.taskset] ?? `${g.taskset}_env`;
        L.reserveGroup(st.ledger, {
          group_id: `${cfg.run.name}.${g.group_id}`,
          prompt_id: g.prompt_id,
          task_source: g.taskset,
          environment,
          recovery_granularity: st.levels?.[environment]?.recovery_granularity ?? 'sibling',
          restore_level: st.levels?.[environment]?.restore_level ?? cfg.rollout_recovery.target_level,
          target_step: Math.floor(st.ledger.cursor / cfg.grpo.num_prompts_per_step),
          tasks: [],
          size: g.size,
          // Run-scoped group ID: two runs on one Gym deployment never share a verification cohort.
          task_ref: { group_id: `${cfg.run.name}.${g.group_id}`, seed: cfg.run.seed, prompt_index: g.prompt_index, group_size: g.size, tasksets: [...cfg.grpo.tasksets] },
        });
        st.ledger.cursor += 1;
      }
    }
    if (!admissionOpen()) return;
    // A bounded number of child starts per workflow task keeps each task's commands small; the
    // main loop comes straight back for the rest.
    const reserved = L.reservedAttempts(st.ledger);
    const todo = reserved.slice(0, MAX_STARTS_PER_TASK);
    if (reserved.length > todo.length) wake();
    const topology = st.topology;
    // Children need only the participants (to retire their attempt), not every endpoint.
    const childTopology: GymTopology = { members: topology.members, servers: {}, fingerprint: topology.fingerprint, instances: {} };
    await Promise.all(
      todo.map(async ({ group, sibling, attempt }) => {
        const episode = L.episodeOfAttempt(sibling, attempt);
        const key = captureKey(episode);
        const env = topology.servers[group.environment];
        if (!env) throw ApplicationFailure.nonRetryable(`no environment server '${group.environment}' in the Gym deployment`, 'invariant_error');
        L.markDispatched(group, sibling, group.environment);
        const workflowId = rolloutWorkflowId(cfg.run.name, episode);
        st.inFlight[key] = { episode, groupId: group.group_id, environment: group.environment, workflowId, stopSignalled: false };
        if (cfg.async_rl.rollout_timeout_s !== null) D.addDeadline(st.deadlines, key, cfg.async_rl.rollout_timeout_s * 1000, Date.now());
        try {
          await startChild(rolloutAttempt, {
            workflowId,
            taskQueue: cfg.run.task_queue,
            parentClosePolicy: ParentClosePolicy.ABANDON,
            staticSummary: `rollout ${key} (${group.task_source}) of run ${cfg.run.name}`,
            staticDetails: `group \`${group.group_id}\`, sibling ${sibling.generation_index}, Gym attempt ${attempt.gym_attempt}${attempt.continued ? ' (continued from a saved turn)' : ''}`,
            args: [
              {
                run: cfg.run.name,
                runWorkflowId: runId,
                episode,
                environment: group.environment,
                environmentUrl: env.url,
                ...(topology.instances?.[group.environment] ? { expectedInstance: topology.instances[group.environment] } : {}),
                ...(group.task_ref
                  ? { taskRef: { ...group.task_ref, sibling: sibling.generation_index, group_attempt: group.cohort_attempt ?? 0 } }
                  : { task: group.tasks[sibling.generation_index] }),
                topology: childTopology,
                controlTaskQueue: cfg.run.task_queue,
                runTaskQueue: cfg.run.rollout_task_queue,
                retireTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
                // Absent in configs parsed before the setting existed.
                ...(cfg.controller.run_heartbeat_timeout_s !== undefined ? { runHeartbeatTimeoutS: cfg.controller.run_heartbeat_timeout_s } : {}),
              },
            ],
          });
        } catch (err) {
          // Already running (a start recorded before a continue-as-new): it will report by signal.
          if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
        }
      }),
    );
  }

  // --- deadlines and stops --------------------------------------------------------------------

  /** In-flight attempts whose cohort started over without them: told to stop by stopAbandoned(). */
  let toStop: InFlight[] = [];

  async function stopAbandoned(): Promise<void> {
    const flights = toStop;
    toStop = [];
    for (const f of flights) {
      if (f.stopSignalled) continue;
      f.stopSignalled = true;
      await getExternalWorkflowHandle(f.workflowId).signal(stopAttempt, 'its cohort starts over').catch(() => undefined);
    }
  }

  async function signalExpired(): Promise<void> {
    const now = Date.now();
    for (const key of D.expired(st.deadlines, now)) {
      const flight = st.inFlight[key];
      D.removeDeadline(st.deadlines, key);
      if (!flight || flight.stopSignalled) continue;
      flight.stopSignalled = true;
      await getExternalWorkflowHandle(flight.workflowId).signal(deadlineExpired).catch(() => undefined);
    }
  }

  // --- forget ----------------------------------------------------------------------------------

  async function forgetFinished(force: boolean): Promise<void> {
    if (!st.topology || st.forgetQueue.length === 0 || checkpointRunning || st.gates.gymCheckpoint) return;
    if (!force && st.forgetQueue.length < FORGET_BATCH) return;
    const batch = st.forgetQueue.slice(0, 1000);
    try {
      await control.gymForget.executeWithOptions({ summary: `forget ${batch.length} rollouts` }, [
        { topology: st.topology, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s, rolloutIds: batch },
      ]);
      st.forgetQueue = st.forgetQueue.slice(batch.length);
    } catch (err) {
      // Kept for the next pass (e.g. a checkpoint opened meanwhile, or retire_incomplete).
      log.warn('forget failed; will retry', { error: String(err) });
    }
  }

  // --- checkpoints -----------------------------------------------------------------------------

  function mintCheckpointId(): string {
    st.checkpointSeq += 1;
    return `rollout-step-${st.steps}-snapshot-${st.checkpointSeq}-${uuid4().replace(/-/g, '')}`;
  }

  function closeGymGate(): void {
    st.gates.gymCheckpoint = true;
    D.hold(st.deadlines, GYM_HOLDER, Date.now());
  }

  function openGymGate(): void {
    st.gates.gymCheckpoint = false;
    D.release(st.deadlines, GYM_HOLDER, Date.now());
  }

  async function record(full: CheckpointOutcome): Promise<void> {
    // Kept (status, summary, metrics file, continue-as-new state) with counts, not the key lists:
    // 50 outcomes of 8,000 keys each would outgrow every payload they travel in.
    // The retention root is the attempt's instruction to the run, not part of the outcome.
    const { scope, restarts, retentionRoot: _retentionRoot, ...o }: CheckpointOutcome = full;
    if (scope) o.scopeCount = scope.length;
    if (restarts) o.restartCount = restarts.length;
    st.checkpoints = [...st.checkpoints, o].slice(-MAX_KEPT_OUTCOMES);
    // Failures of a Gym that is up count towards "Gym does not recover"; an attempt that only found
    // Gym down or restarted does not: the recovery it leads to waits for Gym (bounded) and decides.
    if (o.outcome !== 'failed') st.consecutiveFailures = 0;
    else if (!o.gymRestarted && !o.gymUnreachable) st.consecutiveFailures += 1;
    if (o.outcome === 'completed' && o.snapshotDir) st.lastSnapshot = o.snapshotDir;
    st.lastCheckpointAtMs = Date.now();
    await storage.appendCheckpointMetrics({ checkpointDir: cfg.run.checkpoint_dir, outcome: o }).catch(() => undefined);
    await upsertMemo({ lastCheckpoint: `${o.outcome}/${o.reason}`, lastSnapshot: st.lastSnapshot });
    if (o.reason === 'invariant_error') {
      fatal = ApplicationFailure.nonRetryable(`checkpoint ${o.checkpointId} hit a controller invariant: ${o.error ?? ''}`, 'invariant_error');
    } else if (st.consecutiveFailures >= cfg.rollout_checkpointing.max_consecutive_failures) {
      fatal = ApplicationFailure.nonRetryable(
        `${st.consecutiveFailures} consecutive checkpoint failures (last: ${o.reason}); Gym does not recover`,
        'max_consecutive_failures',
      );
    }
  }

  /** Retries a pending release or abort with the same ID; true when nothing is pending any more. */
  async function retryPending(trigger: CheckpointTrigger): Promise<CheckpointOutcome | undefined> {
    const pending = st.pendingRelease ?? st.pendingAbort;
    if (!pending || !st.topology) return undefined;
    const released = st.pendingRelease !== null;
    const t = Date.now();
    try {
      await control.gymResume.executeWithOptions({ summary: `${released ? 'release' : 'abort'} ${pending.checkpointId} (retry)` }, [
        { topology: st.topology, checkpointId: pending.checkpointId, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s },
      ]);
    } catch (err) {
      const unreachable = unreachableServers(err).length > 0;
      if (unreachable) st.recoveryNeeded = true;
      return {
        checkpointId: pending.checkpointId,
        trigger,
        outcome: 'failed',
        reason: released ? 'release_pending' : 'io_error',
        releasePending: released,
        abortPending: !released,
        ...(unreachable ? { gymUnreachable: true } : {}),
        error: String(err),
        seconds: { resume: (Date.now() - t) / 1000 },
        at: new Date().toISOString(),
      };
    }
    const snapshotDir = st.pendingRelease?.snapshotDir;
    st.pendingRelease = null;
    st.pendingAbort = null;
    openGymGate();
    // A released pending snapshot is a completed checkpoint; an abort only reopens the gate.
    return released
      ? { checkpointId: pending.checkpointId, trigger, outcome: 'completed', reason: 'completed', snapshotDir, seconds: { resume: (Date.now() - t) / 1000 }, at: new Date().toISOString() }
      : undefined;
  }

  async function runCheckpoint(trigger: CheckpointTrigger): Promise<CheckpointOutcome> {
    if (!st.topology) throw ApplicationFailure.nonRetryable('no Gym topology', 'invariant_error');
    if (st.pendingRelease || st.pendingAbort) {
      const wasRelease = st.pendingRelease !== null;
      const retried = await retryPending(trigger);
      if (retried) return retried;
      if (wasRelease) throw new Error('unreachable: a released pending snapshot returns its outcome');
      // The abort went through: continue with a new attempt.
    }
    if (ownsWeights && cfg.checkpointing.enabled && st.lastAnchorStep !== st.steps) {
      // A snapshot binds to a durable trainer anchor of the current step (controller.md §2.1).
      return skipped('missing_trainer_anchor', trigger);
    }
    const checkpointId = mintCheckpointId();
    const closedAt = Date.now();
    closeGymGate();
    setCurrentDetails(`**run** \`${cfg.run.name}\`: checkpoint \`${checkpointId}\` (${trigger}) in progress`);
    // Scope candidates: attempts in flight, and restored replacements (N+1) not dispatched yet —
    // a scope that left them out would delete their saved turns.
    const inFlight = [
      ...Object.values(st.inFlight).map((f) => f.episode),
      ...L.reservedAttempts(st.ledger)
        .filter(({ attempt }) => attempt.continued)
        .map(({ sibling, attempt }) => L.episodeOfAttempt(sibling, attempt)),
    ];
    const atStart = new Set(inFlight.map(captureKey));
    const retentionByRun = patched(RETENTION_BY_RUN);
    const handle = await startChild(checkpointAttempt, {
      workflowId: checkpointWorkflowId(cfg.run.name, checkpointId),
      taskQueue: cfg.run.task_queue,
      parentClosePolicy: ParentClosePolicy.ABANDON,
      staticSummary: `${trigger} checkpoint ${checkpointId} of run ${cfg.run.name}`,
      staticDetails: `${inFlight.length} rollouts in flight at step ${st.steps}`,
      args: [
        {
          run: cfg.run.name,
          runWorkflowId: runId,
          checkpointId,
          trigger,
          topology: st.topology,
          inFlight,
          checkpointDir: cfg.run.checkpoint_dir,
          anchor: st.steps === 0 ? 'bootstrap' : `step_${st.steps}`,
          keepLatestK: cfg.rollout_checkpointing.keep_latest_k,
          prepareTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
          controlTaskQueue: cfg.run.task_queue,
          gymRunDir: cfg.run.gym_run_dir,
          requireModel: cfg.rollout_checkpointing.gym.require_model_participant,
          ...(retentionByRun ? { retentionByRun } : {}),
        },
      ],
    });
    let outcome: CheckpointOutcome | undefined;
    const result = handle.result().then((o) => (outcome = o));
    const committed = (): boolean => cutRequest?.checkpointId === checkpointId;
    const prepared = (): boolean => earlyCutRequest?.checkpointId === checkpointId;
    /** The ledger as it stands, written into the temp snapshot; with the episodes it had in flight. */
    const writeCut = async (tmpDir: string): Promise<{ cut: LedgerCutWritten; inFlight: Set<CaptureKey> }> => {
      applyReports();
      const inFlight = new Set(Object.keys(st.inFlight));
      const cutOf = { dataloaderCursor: st.ledger.cursor, baseTrainStep: st.steps, trainerVersion: st.trainerVersion };
      // A local activity: the ledger (~1 MB packed at 8,000 in flight) stays out of the history.
      const cutInput = { tmpDir, ledger: packJson(st.ledger) };
      const cut = patched(LEDGER_CUT_LOCAL) ? await storageLocal.writeLedgerCut(cutInput) : await storage.writeLedgerCut(cutInput);
      return { cut: { checkpointId, sha256: cut.sha256, bytes: cut.bytes, ...cutOf }, inFlight };
    };
    // Asked after prepare (Gym frozen): the cut is written while Gym commits. It stands unless an
    // episode Gym did not commit was still in flight when it was written.
    let early: { cut: LedgerCutWritten; inFlight: Set<CaptureKey> } | undefined;
    let earlySent = false;
    await condition(() => outcome !== undefined || committed() || prepared());
    if (outcome === undefined && !committed() && prepared()) {
      const req = earlyCutRequest!;
      earlyCutRequest = undefined;
      // Best effort: a commit that failed meanwhile has the attempt discard the temp snapshot
      // (the write is then refused); after a commit the cut is written again if this one is missing.
      early = await writeCut(req.tmpDir).catch((err: unknown) => {
        if (isCancellation(err)) throw err; // the run is being cancelled: not a refused write
        return undefined;
      });
      // The attempt publishes with it at once if Gym committed every episode in flight.
      if (early && patched(TAKE_EARLY_CUT)) {
        void handle.signal(earlyLedgerCutWritten, early.cut).catch(() => undefined);
        earlySent = true;
      }
      await condition(() => outcome !== undefined || committed());
    }
    if (outcome === undefined && committed()) {
      const req = cutRequest!;
      cutRequest = undefined;
      // Episodes neither continued nor restarts finished before the cut: their /run replies are
      // on the wire. Wait briefly so the cut holds their results (an attempt that never reached
      // Gym simply reruns from its input after a cold restore). Dispatch is closed, so nothing
      // joined st.inFlight since the start; anything that did counts as unsettled.
      const unsettled = new Set('unsettled' in req ? req.unsettled : legacyUnsettled(req, atStart));
      let cut = early?.cut;
      let rewritten = false;
      if (!early || [...unsettled].some((k) => early!.inFlight.has(k))) {
        await condition(
          () => Object.keys(st.inFlight).every((k) => atStart.has(k) && !unsettled.has(k)) && st.reports.length === 0,
          cfg.controller.late_result_wait_ms,
        );
        cut = (await writeCut(req.tmpDir)).cut;
        rewritten = true;
      }
      // The attempt publishes with the early cut the run sent it: no confirmation (none to reach it
      // as it completes). Decided by what the history holds (the signal's field), so no patch here.
      const unconfirmed = earlySent && !rewritten && 'takesEarlyCut' in req && req.takesEarlyCut === true;
      if (!unconfirmed) {
        // The attempt may already have published with the early cut and ended: nobody to tell.
        if (patched(TAKE_EARLY_CUT)) await handle.signal(ledgerCutWritten, cut!).catch(() => undefined);
        else await handle.signal(ledgerCutWritten, cut!);
      }
    }
    await result;
    const o = outcome!;
    o.seconds.admission_closed_seconds = (Date.now() - closedAt) / 1000;
    if (o.releasePending && o.snapshotDir) {
      st.pendingRelease = { checkpointId, snapshotDir: o.snapshotDir, trigger };
      st.lastSnapshot = o.snapshotDir; // published and durable even though Gym is still paused
    } else if (o.abortPending) {
      st.pendingAbort = { checkpointId, trigger };
    } else {
      openGymGate();
    }
    // Published: older snapshots go now, with admission open (best effort: the next one retries;
    // the run awaits it before it continues as new or ends).
    if (o.retentionRoot) {
      const applied = storage.applyRetention({ checkpointDir: cfg.run.checkpoint_dir, keepLatestK: cfg.rollout_checkpointing.keep_latest_k }).catch(() => undefined);
      retention = Promise.all([retention, applied]);
    }
    if (o.outcome === 'completed' && o.snapshotDir) st.lastSnapshotScope = o.scope ?? [];
    if (o.gymRestarted || o.gymUnreachable) st.recoveryNeeded = true;
    return o;
  }

  /**
   * Recovery after a Gym crash, with the controller alive (design.md "Recovery"): every attempt in
   * flight reports its dead process; rediscover the fresh processes; restore the latest published
   * snapshot all-or-nothing (scope = its saved attempts N that are still unfinished); continued
   * attempts become N+1 on the same environment server; everything else unfinished starts over
   * from its input. Sealed work is never redone: it is in this workflow's history.
   */
  async function recoverGym(cold = false): Promise<void> {
    D.hold(st.deadlines, RECOVERY_HOLDER, Date.now());
    recovering = true;
    const record: RecoveryRecord = { at: new Date().toISOString(), restoreId: null, snapshotDir: st.lastSnapshot, continued: [], restarted: [] };
    try {
      // Gym first: attempts in flight report only once their processes answer again.
      st.topology = await waitForGym();
      // Gym is up: the failures before this were its crash, not a Gym that does not recover.
      st.consecutiveFailures = 0;
      // A checkpoint left prepared (its abort or release pending) holds the surviving processes'
      // episodes at their boundaries: release it first, or they never report.
      await settlePending();
      for (;;) {
        applyReports();
        await stopAbandoned();
        if (Object.keys(st.inFlight).length === 0) break;
        await condition(() => st.reports.length > 0);
      }
      // Again: a second crash may have come while the attempts reported.
      const topology = await waitForGym();
      st.topology = topology;
      const saved = new Set(st.lastSnapshotScope);
      const unsealed = L.unsealedSiblings(st.ledger);
      // The saved attempt N of a sibling: its current attempt if that was in flight, or the attempt
      // before a restored replacement that never started (a second crash before it ran).
      const savedEpisode = (sib: L.Sibling): EpisodeId | undefined => {
        const cur = L.currentAttempt(sib);
        if (cur.status === 'dispatched' && saved.has(L.siblingKey(sib))) return L.episodeOfAttempt(sib, cur);
        if (cur.status === 'reserved' && cur.continued) {
          const prev = sib.attempts[sib.attempts.length - 2];
          if (prev && saved.has(captureKey(L.episodeOfAttempt(sib, prev)))) return L.episodeOfAttempt(sib, prev);
        }
        return undefined;
      };
      // Only groups resolved to restore at `turn` continue from saved turns (§5.5, §5.6).
      let candidates = st.lastSnapshot ? unsealed.filter((u) => u.group.restore_level === 'turn' && savedEpisode(u.sibling) !== undefined) : [];
      // Group-scored groups re-form at /verify only whole: continue all their unfinished siblings or none.
      candidates = candidates.filter(
        (u) =>
          u.group.recovery_granularity !== 'prompt_group' ||
          unsealed.filter((x) => x.group === u.group).every((x) => candidates.some((c) => c.sibling === x.sibling)),
      );
      const scope = candidates.map((u) => savedEpisode(u.sibling)!);
      const continued = new Set<string>();
      let restoreFailed = false;
      if (scope.length > 0 && st.lastSnapshot) {
        const restoreId = `restore-${uuid4().replace(/-/g, '')}`;
        record.restoreId = restoreId;
        try {
          const r = await control.gymRestore.executeWithOptions({ summary: `restore ${scope.length} episodes from ${st.lastSnapshot}` }, [
            { topology, restoreId, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s, checkpointDir: st.lastSnapshot, scope },
          ]);
          await control.gymResume({ topology, checkpointId: restoreId, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s });
          for (const u of candidates) {
            const e = savedEpisode(u.sibling)!;
            const replacement = captureKey({ rollout_id: e.rollout_id, attempt: e.attempt + 1 });
            if ((r.restored[u.group.environment] ?? []).includes(replacement)) continued.add(u.sibling.rollout_id);
          }
        } catch (err) {
          // All or nothing: the coordination client retired the replacements N+1 everywhere.
          restoreFailed = true;
          record.error = describeFailure(err);
          log.warn('restore after the Gym crash failed; unfinished work starts over', { error: String(err) });
        }
      }
      const retireOld: EpisodeId[] = [];
      const cohortRestarted = new Set<L.PromptGroup>();
      const scopeRollouts = new Set(scope.map((e) => e.rollout_id));
      for (const u of unsealed) {
        const cur = L.currentAttempt(u.sibling);
        if (continued.has(u.sibling.rollout_id)) {
          // A reserved replacement (second crash before it ran) is restored again as the same N+1.
          if (cur.status === 'dispatched') L.continueFromRestore(u.sibling, u.group.environment);
          record.continued.push(L.siblingKey(u.sibling));
          continue;
        }
        if (cur.status === 'reserved' && !cur.continued) {
          if (!cold) continue; // never reached Gym: dispatch as is
          // Cold start: the run that wrote the cut may have dispatched it after the cut; its
          // attempt number is burnt (retired) and the sibling starts over as the next one.
          retireOld.push(L.episodeOfAttempt(u.sibling, cur));
        }
        if (cur.status === 'dispatched') retireOld.push(L.episodeOfAttempt(u.sibling, cur));
        if (u.group.recovery_granularity === 'prompt_group') cohortRestarted.add(u.group);
        L.restartFromInput(u.sibling, 'gym_crash', restoreFailed && scopeRollouts.has(u.sibling.rollout_id) ? 1 : 0);
        record.restarted.push(L.siblingKey(u.sibling));
      }
      for (const g of cohortRestarted) g.cohort_attempt = (g.cohort_attempt ?? 0) + 1;
      // `prompt_group`: saved turns are thrown away and every group with unfinished work reruns whole.
      for (const g of new Set(unsealed.map((u) => u.group))) {
        if (g.restore_level === 'prompt_group') {
          for (const sib of g.siblings) {
            if (L.currentAttempt(sib).status === 'sealed') {
              // Its result is superseded by the rerun: it counts once, when the rerun seals.
              st.completedRollouts -= 1;
              L.restartFromInput(sib, 'prompt_group_rerun');
              record.restarted.push(L.siblingKey(sib));
            }
          }
          g.status = 'generating';
        }
      }
      // A harness of a dead attempt that outlived the crash must not write into the rerun.
      if (retireOld.length > 0) {
        await control.gymRetire({ topology, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s, episodes: retireOld }).catch((err) => {
          log.warn('retiring the dead attempts failed (fresh processes hold nothing of them)', { error: String(err) });
        });
        st.forgetQueue.push(...retireOld.map((e) => e.rollout_id).filter((r) => !L.findSibling(st.ledger, r)));
      }
      log.info('recovered from a Gym crash', { continued: record.continued.length, restarted: record.restarted.length });
    } finally {
      st.recoveries = [...st.recoveries, record].slice(-MAX_KEPT_OUTCOMES);
      st.recoveryNeeded = false;
      recovering = false;
      D.release(st.deadlines, RECOVERY_HOLDER, Date.now());
      wake();
    }
  }

  /**
   * Discovery until every Gym participant answers: after a crash the run's normal state, not a
   * failure. Retried with backoff up to `controller.gym_recovery_timeout_s`; meanwhile the status
   * phase is `waiting_for_gym` and the UI shows the pending discovery with its attempts.
   */
  async function waitForGym(): Promise<GymTopology> {
    st.waitingForGymSince = new Date().toISOString();
    setCurrentDetails(`**run** \`${cfg.run.name}\`: waiting for Gym to answer again (since ${st.waitingForGymSince}, up to ${gymRecoveryTimeoutS} s)`);
    try {
      return await gymRecovery.discoverGym.executeWithOptions({ summary: `wait for Gym (up to ${gymRecoveryTimeoutS} s)` }, [
        { runDir: cfg.run.gym_run_dir, requireModel: cfg.rollout_checkpointing.gym.require_model_participant },
      ]);
    } catch (err) {
      if (isCancellation(err)) throw err;
      throw ApplicationFailure.nonRetryable(
        `Gym did not answer within controller.gym_recovery_timeout_s (${gymRecoveryTimeoutS} s) after a crash: ${describeFailure(err)}`,
        'gym_unavailable',
      );
    } finally {
      st.waitingForGymSince = null;
    }
  }

  /** Retries a pending release or abort until it goes through (a failure of a Gym that is up counts as usual). */
  async function settlePending(): Promise<void> {
    for (let i = 0; st.pendingRelease || st.pendingAbort; i++) {
      const o = await retryPending((st.pendingRelease ?? st.pendingAbort)!.trigger);
      if (o) await record(o);
      if (fatal) throw fatal;
      if (st.pendingRelease || st.pendingAbort) {
        if (o?.gymUnreachable) st.topology = await waitForGym();
        else await sleep(Math.min(10_000, 1_000 * 2 ** i));
      }
    }
  }

  function skipped(reason: 'missing_trainer_anchor', trigger: CheckpointTrigger): CheckpointOutcome {
    return { checkpointId: '', trigger, outcome: 'skipped', reason, seconds: {}, at: new Date().toISOString() };
  }

  function checkpointDue(): boolean {
    if (checkpointRunning || !st.topology) return false;
    if (manualRequested > manualServed || boundaryRequested) return true;
    if (st.pendingRelease || st.pendingAbort) {
      // Retry a pending release/abort soon: admission stays closed until it goes through.
      return Date.now() - (st.lastCheckpointAtMs ?? 0) >= Math.min(intervalMs ?? 5_000, 5_000);
    }
    if (intervalMs === null) return false;
    return Date.now() - (st.lastCheckpointAtMs ?? workflowStartMs) >= intervalMs;
  }

  function startCheckpoint(): void {
    const manual = manualRequested > manualServed;
    const ticket = manual ? ++manualServed : 0;
    const trigger: CheckpointTrigger = manual ? 'manual' : boundaryRequested ? 'trainer_boundary' : 'periodic';
    boundaryRequested = false;
    checkpointRunning = true;
    void (async () => {
      try {
        const o = await runCheckpoint(trigger);
        if (o.outcome === 'skipped' && o.reason === 'missing_trainer_anchor') {
          // Logged once per step, not every tick; not a failure and not an attempt.
          if (st.missingAnchorStep !== st.steps) {
            st.missingAnchorStep = st.steps;
            log.info('periodic checkpoint skipped: no trainer anchor for this step yet', { step: st.steps });
          }
          st.lastCheckpointAtMs = Date.now();
          if (ticket) manualOutcomes[ticket] = o;
          return;
        }
        await record(o);
        if (ticket) manualOutcomes[ticket] = o;
      } catch (err) {
        fatal = err instanceof ApplicationFailure ? err : ApplicationFailure.nonRetryable(String(err), 'invariant_error');
      } finally {
        checkpointRunning = false;
        wake();
      }
    })();
  }

  const workflowStartMs = Date.now();

  /**
   * A new run on an existing checkpoint directory (`restore_mode: latest`, controller.md §3.7, §4):
   * the newest valid trainer anchor, then that anchor's newest snapshot that validates against the
   * discovered topology — or, without one, the anchor's Gym-restart fallback (keep sealed siblings,
   * start every unfinished one over). The ledger is checked before anything is admitted; the Gym
   * restore itself is the recovery pass that runs before the first dispatch. True when there is
   * something to recover.
   */
  async function coldStart(topology: GymTopology): Promise<boolean> {
    const checkpointDir = cfg.run.checkpoint_dir;
    const refuse = (message: string): ApplicationFailure => ApplicationFailure.nonRetryable(`restore_mode latest: ${message}`, 'invalid_restore');
    const anchor = ownsWeights ? await trainer.latestTrainerAnchor({ checkpointDir }) : null;
    const snap = await storage.latestSnapshot({ checkpointDir, fingerprint: topology.fingerprint, ...(anchor ? { anchor: anchor.anchor } : {}) });
    let ledger: unknown;
    let step: number;
    let version: number;
    if (snap) {
      if (anchor && snap.manifest.base_train_step !== anchor.step) {
        throw refuse(`snapshot ${snap.dir} is at step ${snap.manifest.base_train_step}, not at its anchor ${anchor.anchor}`);
      }
      // Packed since the ledger of thousands in flight outgrew one payload; plain in older histories.
      ledger = unpacked(snap.ledger);
      step = snap.manifest.base_train_step;
      version = snap.manifest.trainer_version;
    } else if (anchor) {
      const fallback = await trainer.readGymRestartFallback({ checkpointDir, anchor: anchor.anchor });
      if (!fallback) throw refuse(`trainer anchor ${anchor.anchor} in ${checkpointDir} has neither a snapshot nor a Gym-restart fallback marker; refusing to start (use restore_mode: none or a new checkpoint_dir)`);
      if (fallback.gym_topology_fingerprint !== topology.fingerprint) {
        throw refuse(`the Gym topology of ${anchor.anchor} (${fallback.gym_topology_fingerprint.slice(0, 12)}…) differs from the discovered one (${topology.fingerprint.slice(0, 12)}…)`);
      }
      ledger = unpacked(fallback.ledger);
      step = anchor.step;
      version = anchor.version;
    } else {
      return false; // nothing to take over: a fresh start
    }
    try {
      checkLedger(ledger as L.Ledger);
    } catch (err) {
      throw refuse(`the ledger of ${snap?.dir ?? anchor?.anchor} is invalid: ${(err as Error).message}`);
    }
    if (anchor) {
      const url = backendUrl();
      if (!url && trainerKind === 'tiny_grpo') throw ApplicationFailure.nonRetryable('the Gym deployment has no inference server to refit', 'invariant_error');
      const r = await trainer.restoreTrainer({ run: cfg.run.name, checkpointDir, ...(url ? { backendUrl: url } : {}), anchor: anchor.anchor, adopt: true });
      version = r.version;
      st.lastAnchorStep = anchor.step;
    }
    const restored = ledger as L.Ledger;
    st.ledger = restored;
    st.steps = step;
    st.trainerVersion = version;
    // Groups of the steps before it were trained; count their rollouts with the sealed ones carried.
    st.completedRollouts =
      step * cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt +
      Object.values(restored.groups).reduce((n, g) => n + g.siblings.filter((s) => L.currentAttempt(s).status === 'sealed').length, 0);
    st.lastSnapshot = snap?.dir ?? null;
    st.lastSnapshotScope = snap?.manifest.gym_checkpoint.scope ?? [];
    st.restoredFrom = { anchor: anchor?.anchor ?? null, snapshotDir: snap?.dir ?? null, step, trainerVersion: version, skipped: snap?.skipped ?? [] };
    st.recoveryNeeded = true;
    log.info('cold start: taking over an existing checkpoint', { ...st.restoredFrom, skipped: st.restoredFrom.skipped.length });
    return true;
  }

  /**
   * Target-level resolution at setup (controller.md §5.6, §5.7): each configured environment gets
   * the finest level at or below the target that discovery says it supports; a combination that
   * fails ends the run here, naming the config keys, before any work is admitted.
   */
  function setupLevels(topology: GymTopology): void {
    const environmentOf = (taskset: string): string => cfg.grpo.environments[taskset] ?? `${taskset}_env`;
    const names = [...new Set(cfg.grpo.tasksets.map(environmentOf))];
    const unreported: string[] = [];
    const environments: EnvironmentCapabilities[] = names.map((name) => {
      const caps = topology.environments?.[name];
      if (caps) return caps;
      unreported.push(name);
      // Not reported (not a participant, or a server without our capabilities): assume the least.
      return { environment: name, agent: '', supports_continuations: false, resources_checkpoint_mode: 'restart_only', verify_replayable: false, group_size: null };
    });
    try {
      const r = resolveLevels({
        target: cfg.rollout_recovery.target_level,
        environments,
        agentOverrides: cfg.rollout_recovery.agent_target_level_overrides,
        taskSourceOverrides: cfg.rollout_recovery.task_source_target_level_overrides,
        taskSourceEnvironments: Object.fromEntries(cfg.grpo.tasksets.map((t) => [t, environmentOf(t)])),
        numGenerationsPerPrompt: cfg.grpo.num_generations_per_prompt,
        rolloutTimeoutS: cfg.async_rl.rollout_timeout_s,
      });
      st.levels = r.levels;
      st.levelWarnings = [...unreported.map((n) => `environment ${n}: not reported by Gym discovery; assumed restart-only without continuations`), ...r.warnings];
    } catch (err) {
      if (err instanceof TargetLevelError) {
        throw ApplicationFailure.nonRetryable(err.message, 'invalid_recovery_setup', { problems: err.problems });
      }
      throw err;
    }
    for (const w of st.levelWarnings) log.warn(w);
    log.info('recovery levels resolved', {
      levels: Object.fromEntries(Object.values(st.levels).map((l) => [l.environment, `${l.recovery_granularity}/${l.restore_level}`])),
    });
  }

  // --- main loop ---------------------------------------------------------------------------------

  if (!st.topology) {
    st.topology = await control.discoverGym({ runDir: cfg.run.gym_run_dir, requireModel: cfg.rollout_checkpointing.gym.require_model_participant });
  }
  if (!st.levels) setupLevels(st.topology);
  let coldRecoveryPending = false;
  if (!input.state && cfg.rollout_checkpointing.restore_mode === 'latest') coldRecoveryPending = await coldStart(st.topology);
  await upsertMemo({ run: cfg.run.name, steps: st.steps });
  const done = (): boolean => (st.steps >= cfg.grpo.max_num_steps || st.stopRequested) && Object.keys(st.inFlight).length === 0 && !checkpointRunning;

  for (;;) {
    if (fatal) throw fatal;
    changed = false;
    applyReports();
    await trainReadyGroups();
    if (st.recoveryNeeded && !checkpointRunning) await recoverGym(coldRecoveryPending);
    coldRecoveryPending = false;
    if (done() && !st.pendingRelease && !st.pendingAbort && manualRequested === manualServed) break;
    if (checkpointDue()) startCheckpoint();
    await signalExpired();
    await stopAbandoned();
    if (st.steps < cfg.grpo.max_num_steps) await dispatch();
    await forgetFinished(false);
    setCurrentDetails(
      `**run** \`${cfg.run.name}\` — ${phase()}\n\nstep ${st.steps}/${cfg.grpo.max_num_steps}, ${Object.keys(st.inFlight).length} rollouts in flight, ` +
        `${st.completedRollouts} completed, last snapshot: ${st.lastSnapshot ?? 'none'}`,
    );
    const info = workflowInfo();
    if (!checkpointRunning && (info.historyLength > cfg.controller.max_history_events || info.continueAsNewSuggested)) {
      await condition(allHandlersFinished);
      await retention;
      if (!checkpointRunning && manualRequested === manualServed && info.historyLength >= carryRetryAt) {
        const state = packRunState({ ...st, continuedAsNew: st.continuedAsNew + 1 }, cfg.run.name);
        const bytes = JSON.stringify(state).length;
        if (bytes <= MAX_CARRIED_STATE_BYTES) await continueAsNew<typeof trainingRun>({ config: cfg, state });
        // Over the payload limit the continue-as-new would fail its workflow task forever: keep
        // running on this history (hard limits: 51,200 events / 50 MiB), try again later.
        carryRetryAt = info.historyLength + 1_000;
        log.error('run state too large to continue as new; continuing on the current history', {
          bytes,
          limit: MAX_CARRIED_STATE_BYTES,
          inFlight: Object.keys(st.inFlight).length,
        });
      }
    }
    const timeouts = [D.nextExpiryMs(st.deadlines, Date.now()), nextCheckpointMs()].filter((x): x is number => x !== undefined);
    const wait = timeouts.length ? Math.max(1, Math.min(...timeouts)) : undefined;
    if (!changed) {
      if (wait === undefined) await condition(() => changed || fatal !== undefined);
      else await condition(() => changed || fatal !== undefined, wait);
    }
  }

  await forgetFinished(true);
  await condition(allHandlersFinished);
  await retention;
  return {
    run: cfg.run.name,
    steps: st.steps,
    rewardPerStep: st.rewardPerStep,
    completedRollouts: st.completedRollouts,
    failedRollouts: st.failedRollouts,
    checkpoints: st.checkpoints,
    lastSnapshot: st.lastSnapshot,
    continuedAsNew: st.continuedAsNew,
    recoveries: st.recoveries,
    trainerVersion: st.trainerVersion,
    restoredFrom: st.restoredFrom ?? null,
  };

  function nextCheckpointMs(): number | undefined {
    if (checkpointRunning) return undefined;
    if (st.pendingRelease || st.pendingAbort) return 5_000;
    if (intervalMs === null) return undefined;
    return Math.max(0, intervalMs - (Date.now() - (st.lastCheckpointAtMs ?? workflowStartMs)));
  }
}
