// The training run's state: what it carries across continue-as-new (the recovery ledger, gates,
// deadlines, the attempts in flight, the checkpoint pump's record) and what it returns.
import type { TrainBatch } from '../../activities/trainer.js';
import type { CheckpointOutcome, CheckpointTrigger, GymTopology, RolloutReport } from '../../protocol/controller.js';
import type { CaptureKey, EpisodeId } from '../../protocol/episode-id.js';
import type { PackedJson } from '../../protocol/packed-json.js';
import type { RunConfig } from '../../protocol/run-config.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import type { EnvironmentLevel } from '../target-levels.js';

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
  /** Live failures not charged to their siblings until the run has looked at Gym (run/reports.ts). */
  unconfirmedFailures: RolloutReport[];
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
  /** Since when a recovery waits for Gym to answer again (ISO time), or null. */
  waitingForGymSince: string | null;
  recoveries: RecoveryRecord[];
  /** What a cold `restore_mode: latest` start took over (null: started fresh, or a warm run). */
  restoredFrom: RestoredFrom | null;
  /** The step whose missing trainer anchor was already reported (log once per step). */
  missingAnchorStep: number | null;
  /** Per environment (`recovery_granularity`, `restore_level`), resolved once at setup from discovery. */
  levels: Record<string, EnvironmentLevel> | null;
  /** One per environment whose level was lowered (controller.md §5.6 rule 2). */
  levelWarnings: string[];
  /** Rollout shards started (run/shards.ts); 0 before the first dispatch. */
  shards: number;
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
  /** Carried across continue-as-new, packed (run/codec.ts). */
  state?: PackedJson;
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
    unconfirmedFailures: [],
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
    waitingForGymSince: null,
    recoveries: [],
    restoredFrom: null,
    missingAnchorStep: null,
    levels: null,
    levelWarnings: [],
    shards: 0,
  };
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
