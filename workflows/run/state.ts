// The training run's state: what it carries across continue-as-new. Nothing per rollout: the
// prompt groups in flight, their attempts and results live in the rollout shards
// (rolloutShard.ts); the run keeps the dataset cursor, the steps, the gates and holds, the
// checkpoint pump's record, and a line per sealed group waiting for a training step.
import type { CheckpointOutcome, CheckpointTrigger, GymTopology } from '../../protocol/controller.js';
import type { CaptureKey } from '../../protocol/episode-id.js';
import type { RunConfig } from '../../protocol/run-config.js';
import type { Holds, ShardReport } from '../messages.js';
import type { EnvironmentLevel } from '../target-levels.js';

export interface RunState {
  /** Dataloader cursor: the next prompt group to reserve. */
  cursor: number;
  topology: GymTopology | null;
  /** true = closed. Neither owner reopens the other's gate (controller.md §1.1). */
  gates: { weightSync: boolean; gymCheckpoint: boolean };
  /** The holds last sent to the shards (run/holds.ts). */
  holds: Holds;
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
  /** Shard reports received and not yet applied. */
  reports: ShardReport[];
  /** Sealed groups not trained yet: `[dataset position, shard]` (their results are in the shard). */
  ready: Array<[index: number, shard: number]>;
  /**
   * Per shard: groups assigned so far; and, as of its last report, how many of those it had
   * received, how many groups it had unfinished, how many attempts in flight.
   */
  assigned: number[];
  reported: Array<{ assigned: number; unfinished: number; inFlight: number }>;
  lastCheckpointAtMs: number | null;
  checkpointSeq: number;
  continuedAsNew: number;
  paused: boolean;
  stopRequested: boolean;
  /** Batches trained since the newest trainer anchor (their files re-sent when the trainer lost its state). */
  trainedBatches: Array<{ step: number; expectedVersion: number; batchFiles: string[]; cursor: number }>;
  /** Step of the newest durable trainer anchor (0: bootstrap). */
  lastAnchorStep: number;
  /** A Gym process restarted under in-flight attempts: restore and redispatch before new work. */
  recoveryNeeded: boolean;
  /** Since when a recovery waits for Gym to answer again (ISO time), or null. */
  waitingForGymSince: string | null;
  recoveries: RecoveryRecord[];
  /** Recoveries done: a shard's crash report from before the last one (a lower epoch) was that one's. */
  recoveryEpoch: number;
  /** What a cold `restore_mode: latest` start took over (null: started fresh, or a warm run). */
  restoredFrom: RestoredFrom | null;
  /** The saved ledger the shards take their slices of when they start (a cold start). */
  loadFrom: { dir: string; files: string[] } | { marker: string } | null;
  /** The step whose missing trainer anchor was already reported (log once per step). */
  missingAnchorStep: number | null;
  /** Per environment (`recovery_granularity`, `restore_level`), resolved once at setup from discovery. */
  levels: Record<string, EnvironmentLevel> | null;
  /** One per environment whose level was lowered (controller.md §5.6 rule 2). */
  levelWarnings: string[];
  /** Rollout shards started (run/shards.ts); 0 before the first dispatch. */
  shards: number;
  /** Requests to the shards issued so far (their IDs). */
  requestSeq: number;
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
  /** Siblings that went on from their saved turn, and siblings that started over. */
  continued: number;
  restarted: number;
  /** Some of the continued siblings (at most MAX_RECOVERY_SAMPLE in all), by the capture key they go on as. */
  continuedSample: CaptureKey[];
  error?: string;
}

export interface TrainingRunInput {
  config: RunConfig;
  /** Carried across continue-as-new. */
  state?: RunState;
}

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

/** Outcomes and recoveries the run keeps (status, summary, continue-as-new). */
export const MAX_KEPT_OUTCOMES = 50;

/**
 * Continued capture keys a recovery record keeps, taken from every shard in turn. A sample per
 * shard (32 shards at 16,000 in flight) made a few recoveries carry more than the run's
 * continue-as-new bound.
 */
export const MAX_RECOVERY_SAMPLE = 100;

/** Keeps a finished recovery's record, its sample of continued keys (per shard) cut to a bounded one. */
export function keepRecovery(st: RunState, rec: RecoveryRecord, continuedPerShard: CaptureKey[][] = []): void {
  const sample: CaptureKey[] = [];
  for (let i = 0; sample.length < MAX_RECOVERY_SAMPLE; i++) {
    const round = continuedPerShard.filter((keys) => i < keys.length).map((keys) => keys[i]!);
    if (round.length === 0) break;
    sample.push(...round.slice(0, MAX_RECOVERY_SAMPLE - sample.length));
  }
  st.recoveries = [...st.recoveries, { ...rec, continuedSample: sample }].slice(-MAX_KEPT_OUTCOMES);
}

export function initialState(): RunState {
  return {
    cursor: 0,
    topology: null,
    gates: { weightSync: false, gymCheckpoint: false },
    holds: { seq: 0, admission: [], deadlines: [], reports: [] },
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
    ready: [],
    assigned: [],
    reported: [],
    lastCheckpointAtMs: null,
    checkpointSeq: 0,
    continuedAsNew: 0,
    paused: false,
    stopRequested: false,
    trainedBatches: [],
    lastAnchorStep: 0,
    recoveryNeeded: false,
    waitingForGymSince: null,
    recoveries: [],
    recoveryEpoch: 0,
    restoredFrom: null,
    loadFrom: null,
    missingAnchorStep: null,
    levels: null,
    levelWarnings: [],
    shards: 0,
    requestSeq: 0,
  };
}

/** Applies the shards' reports (pure): sealed groups join `ready`, counts and crashes are noted. */
export function applyShardReports(st: RunState): void {
  const reports = st.reports;
  st.reports = [];
  const have = new Set(st.ready.map(([index]) => index));
  for (const r of reports) {
    for (const index of r.sealed) {
      if (have.has(index)) continue;
      have.add(index);
      st.ready.push([index, r.shard]);
    }
    st.completedRollouts += r.completed;
    st.failedRollouts += r.failed;
    st.reported[r.shard] = { assigned: r.assigned, unfinished: r.unfinished, inFlight: r.inFlight };
    if (r.gymCrashed !== undefined && r.epoch >= st.recoveryEpoch) st.recoveryNeeded = true;
  }
}

/** Attempts in flight in every shard, as last reported. */
export function totalInFlight(st: RunState): number {
  return st.reported.reduce((n, r) => n + (r?.inFlight ?? 0), 0);
}

/** Unfinished groups in every shard: as last reported, plus the ones assigned since that report was written. */
export function totalUnfinished(st: RunState): number {
  let n = 0;
  for (let k = 0; k < st.shards; k++) n += (st.reported[k]?.unfinished ?? 0) + (st.assigned[k] ?? 0) - (st.reported[k]?.assigned ?? 0);
  return n;
}

export function summaryOf(cfg: RunConfig, st: RunState): RunSummary {
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
    restoredFrom: st.restoredFrom,
  };
}
