// Shapes that cross the boundary between the controller's workflows and its activities. Types
// only (and tiny pure helpers): workflow code imports this file, so it must stay free of I/O.
import { NON_RETRYABLE_CODES } from './errors.js';
import type { CaptureKey, EpisodeId, Kind } from './ids.js';

/** A Gym participant as discovered (control status answered). */
export interface GymMember {
  name: string;
  url: string;
  kind: Kind;
}

/** A Gym deployment as the controller sees it. */
/** Gym's resource checkpoint mode (`exported` is Gym's name for export/restore). */
export type ResourcesCheckpointMode = 'stateless' | 'exported' | 'restart_only';

/** What discovery reports for one environment (§5.6 rule 1; the capability is the source of truth). */
export interface EnvironmentCapabilities {
  environment: string;
  /** Exact Gym agent name (the key of `agent_target_level_overrides`). */
  agent: string;
  /** The agent class can continue an episode from a saved turn. */
  supports_continuations: boolean;
  resources_checkpoint_mode: ResourcesCheckpointMode;
  /** `checkpoint_replayable_verify` on the agent. */
  verify_replayable: boolean;
  /** Group-scored (e.g. GenRM compare): Gym's `num_rollouts_per_prompt`; null for ordinary environments. */
  group_size: number | null;
  /** A group-scored server's own cohort deadline (null: none reported). */
  cohort_collection_timeout_s?: number | null;
}

export interface GymTopology {
  members: GymMember[];
  /** Every server of the deployment by name (environment servers receive `/run`). */
  servers: Record<string, { kind: string; url: string }>;
  /** SHA-256 of the sorted (name, kind) list: a snapshot only restores into the same topology. */
  fingerprint: string;
  /** server name → its process identity (`instance_id` in status); changes when it restarts fresh. */
  instances: Record<string, string>;
  /** environment server name → what discovery found it supports (controller.md §5.6 rule 1). */
  environments?: Record<string, EnvironmentCapabilities>;
}

export interface GymPrepareOutcome {
  checkpointId: string;
  prepared: boolean;
  /** Capture keys some participant cannot capture (never in the scope). */
  restarts: CaptureKey[];
  /** server name → blockers, for stages that did not prepare. */
  blockers: Record<string, string[]>;
  seconds: number;
}

/** What one participant committed, as the snapshot manifest records it. */
export interface GymParticipantCommit {
  kind: string;
  instance: string;
  manifest: Record<string, unknown>;
  episode_ids: CaptureKey[];
}

/** The same without its episode IDs (thousands at scale), which stay in the commit file. */
export interface GymParticipantCommitSummary {
  kind: string;
  instance: string;
  manifest: Record<string, unknown>;
  episode_count: number;
}

/** Each participant's commit with its episode IDs replaced by their count. */
export function commitSummaries(participants: Record<string, GymParticipantCommit>): Record<string, GymParticipantCommitSummary> {
  const out: Record<string, GymParticipantCommitSummary> = {};
  for (const [name, { episode_ids, ...rest }] of Object.entries(participants)) out[name] = { ...rest, episode_count: episode_ids.length };
  return out;
}

/**
 * Written by the commit into the temp snapshot directory: the scope and every participant's
 * committed episode IDs, the snapshot's episode index. The manifest names it with its digest and
 * keeps only counts, so these lists never travel through workflow histories (~1.2 MB at 8,000 in
 * flight, over Temporal's 2 MiB payload limit at ~14,000) nor are written twice.
 */
export const GYM_COMMIT_FILE = 'gym_commit.json';

export interface GymCommitFile {
  checkpoint_id: string;
  scope: CaptureKey[];
  participants: Record<string, GymParticipantCommit>;
}

export interface GymCommitOutcome {
  checkpointId: string;
  /** server name → what it committed (its episode IDs are in the commit file). */
  participants: Record<string, GymParticipantCommitSummary | GymParticipantCommit>;
  /** Episodes in the scope the commit sent (the keys are in the commit file). */
  scopeCount: number;
  /** Scope episodes no environment server committed (they finished before the cut): usually none. */
  uncommitted: CaptureKey[];
  seconds: number;
}

export interface GymRestoreOutcome {
  restoreId: string;
  /** server name → replacement capture keys it installed (empty when they went to the recovery's directory). */
  restored: Record<string, CaptureKey[]>;
  /** server name → how many it installed, when the keys went to the recovery's directory. */
  restoredCounts?: Record<string, number>;
  scopeCount?: number;
  seconds: number;
}

/**
 * Where a sibling's task comes from in the deterministic dataset: workflow state and child inputs
 * carry this small reference instead of the task (thousands of tasks would exceed payload limits).
 */
export interface TaskRef {
  /** The run-scoped group ID: group-scored verification groups its cohort by it. */
  group_id?: string;
  seed: number;
  prompt_index: number;
  group_size: number;
  sibling: number;
  tasksets: string[];
  group_attempt?: number;
}

/** One physical attempt's `/run` input. */
export interface RunEpisodeInput {
  run: string;
  environment: string;
  environmentUrl: string;
  episode: EpisodeId;
  /** The task itself, or `taskRef` to build it from the dataset. */
  task?: unknown;
  taskRef?: TaskRef;
  /** The environment process the attempt belongs to; a fresh process refuses with `instance_mismatch`. */
  expectedInstance?: string;
  /** The workflow (the attempt's shard) the activity signals a completed report to itself. */
  reportTo?: string;
}

/** What a rollout attempt reports to the training run. */
export interface RolloutReport {
  captureKey: CaptureKey;
  episode: EpisodeId;
  /** `completed`: /run replied with a result; `failed`: handled failure or refusal; `timed_out`: deadline fired; `retired`: given up by the controller. */
  status: 'completed' | 'failed' | 'timed_out' | 'retired';
  reward: number | null;
  /** Terminal failures are not retried. */
  terminal: boolean;
  reason?: string;
  /** The result as returned by the environment (kept small: reward and a few fields). */
  result?: Record<string, unknown> | null;
  seconds: number;
  /** The `/run` activity signalled this report to the shard already (activities/rollouts.ts). */
  reported?: true;
}

/** What a checkpoint's outcome says of the snapshot it published (`snapshotPublishedBy`). */
export interface PublishedCounts {
  scopeCount: number;
  restartCount: number;
}

export interface SnapshotLocation {
  /** `<checkpoint_dir>/<anchor>/rollout_snapshots` */
  root: string;
  anchor: string;
  sequence: number;
  tmpDir: string;
  finalDir: string;
}

export interface SnapshotManifest {
  schema_version: 2;
  format: 'rollout-checkpoint/ts';
  run: string;
  checkpoint_id: string;
  sequence: number;
  base_train_step: number;
  trainer_version: number;
  dataloader_cursor: number;
  gym_topology_fingerprint: string;
  gym_checkpoint: {
    restarts: CaptureKey[];
    /** What each participant committed, its episode IDs counted: the IDs are in `commit_file`. */
    participants: Record<string, GymParticipantCommitSummary>;
    /** The snapshot's `GYM_COMMIT_FILE`: the scope and each participant's episode IDs. */
    commit_file: FileDigest;
  };
  /** The controller's ledger at the cut: one part per rollout shard (`controller/ledger-<k>.json`). */
  ledger_parts: FileDigest[];
  created_at: string;
}

/** A file of a snapshot (path relative to its directory) with its digest. */
export interface FileDigest {
  file: string;
  sha256: string;
  bytes: number;
}

// --- the controller's files -----------------------------------------------------------------
// Per-rollout lists (the episodes in flight, a ledger slice, a restore's scope, a step's batch)
// never travel through a workflow: at 16,000 rollouts in flight each is ~1 MB, far over what one
// payload or one workflow's state should carry. The rollout shards write their part of each into
// a file; activities read the parts; workflows pass paths and counts.

/** The rollout shard that owns a prompt group (every attempt of a group): FNV-1a of its ID. */
export function shardOf(groupId: string, shards: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < groupId.length; i++) {
    h ^= groupId.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % shards;
}

/** The group of a rollout ID (`<group>.g<k>`). */
export function groupOfRollout(rolloutId: string): string {
  return rolloutId.slice(0, rolloutId.lastIndexOf('.g'));
}

/** In a temp snapshot: a shard's episodes in flight when admission closed (the scope's candidates). */
export function candidatesFile(shard: number): string {
  return `controller/candidates-${shard}.json`;
}

/** In a snapshot: a shard's ledger part. */
export function ledgerPartFile(shard: number): string {
  return `controller/ledger-${shard}.json`;
}

/** A shard's candidates: `[rollout_id, attempt]` pairs. */
export interface CandidatesFile {
  shard: number;
  episodes: Array<[string, number]>;
}

/** Where a recovery's files go: `<checkpoint_dir>/recoveries/<restore id>/`. */
export function recoveryDir(checkpointDir: string, restoreId: string): string {
  return `${checkpointDir}/recoveries/${restoreId}`;
}

/** In a recovery's directory: a shard's part of the restore scope, `[rollout_id, attempt, environment]`. */
export function scopePartFile(shard: number): string {
  return `scope-${shard}.json`;
}

/** In a recovery's directory: what the restore installed (server name → replacement capture keys). */
export const RESTORED_FILE = 'restored.json';

/** A training step's batch parts: `<checkpoint_dir>/batches/step_<s>/part-<k>.json`. */
export function batchPartFile(checkpointDir: string, step: number, shard: number): string {
  return `${checkpointDir}/batches/step_${step}/part-${shard}.json`;
}

/** Where a trainer anchor's Gym-restart fallback ledger parts wait until the anchor is durable. */
export function fallbackPartsDir(checkpointDir: string, step: number): string {
  return `${checkpointDir}/fallback-parts/step_${step}`;
}

/**
 * A snapshot manifest as an attempt hands it to its finalize: without the commit file's digest,
 * which the finalize adds (the attempt's commit outcome may still carry episode IDs: counted).
 */
export type SnapshotManifestSlim = Omit<SnapshotManifest, 'gym_checkpoint'> & {
  gym_checkpoint: {
    restarts: CaptureKey[];
    participants: Record<string, GymParticipantCommit | GymParticipantCommitSummary>;
  };
};

export type CheckpointTrigger = 'periodic' | 'manual' | 'trainer_boundary';
export type CheckpointOutcomeKind = 'completed' | 'skipped' | 'failed';
export type CheckpointReason =
  | 'completed'
  | 'missing_trainer_anchor'
  | 'trainer_state_changed'
  | 'timeout'
  | 'io_error'
  | 'invariant_error'
  | 'release_pending';

/**
 * A checkpoint attempt's stages in the order they start, each with what it is: the one list the
 * attempt's timings, its details in the UI, the metrics and the run report all use.
 */
export const CHECKPOINT_STAGES = {
  allocate: 'snapshot directory',
  candidates: 'shards write their episodes in flight and ledger parts; no Gym process restarted',
  prepare: 'Gym prepares',
  commit: 'Gym commits',
  ledger_cut: 'shards write their ledger parts again (recut)',
  publish: 'manifest and publish',
  resume: 'Gym resumes',
} as const;
export type CheckpointStage = keyof typeof CHECKPOINT_STAGES;
export const CHECKPOINT_STAGE_NAMES = Object.keys(CHECKPOINT_STAGES) as CheckpointStage[];

/** Seconds of each stage that ran, and the totals: Gym's three calls, admission closed, start to end. */
export type CheckpointStageSeconds = Partial<Record<CheckpointStage | 'gym_participant_seconds' | 'admission_closed_seconds' | 'total', number>>;

export interface CheckpointOutcome {
  checkpointId: string;
  trigger: CheckpointTrigger;
  outcome: CheckpointOutcomeKind;
  reason: CheckpointReason;
  /** Published snapshot directory, when one was published (also for release_pending). */
  snapshotDir?: string;
  sequence?: number;
  /**
   * Scope the snapshot continues (capture keys), for recovery, and the restarts. Only in the
   * attempt's own result: the outcomes a run keeps (status, summary, metrics file) carry the counts.
   */
  scope?: CaptureKey[];
  restarts?: CaptureKey[];
  scopeCount?: number;
  restartCount?: number;
  /** Published but Gym not yet released: dispatch stays closed, the next attempt retries the release. */
  releasePending?: boolean;
  /** Gym prepared but the abort failed: dispatch stays closed, the next attempt retries the abort. */
  abortPending?: boolean;
  /** A Gym process restarted since the controller last saw it: recover before checkpointing. */
  gymRestarted?: boolean;
  /**
   * A participant could not be reached (connection refused or broken): Gym is down or restarting.
   * Not a failure of a Gym that is up: the run waits for Gym and recovers.
   */
  gymUnreachable?: boolean;
  error?: string;
  seconds: CheckpointStageSeconds;
  at: string;
  /** When the attempt reopened admission in the rollout shards (epoch ms of its workflow clock). */
  releasedAtMs?: number;
}

/**
 * One outcome's identity in checkpoint_metrics.jsonl: its checkpoint ID and when it was decided (a
 * skipped attempt has no checkpoint ID, so the ID alone would make every skip one line).
 */
export function outcomeKey(o: Pick<CheckpointOutcome, 'checkpointId' | 'at'>): string {
  return `${o.checkpointId}@${o.at}`;
}

/** Application failure types the activities raise (the type is what workflows branch on). */
/**
 * The rollout worker beats each `/run` it keeps once this share of its heartbeat timeout has passed
 * since the last beat (plus jitter up to 0.2 of it; activities/run-keeper.ts); the run sizes the
 * timeout from it so a window of `/run`s stays within `controller.run_heartbeats_per_s`.
 */
export const RUN_BEAT_SHARE = 0.5;

export const FAILURE_TYPES = {
  transient: 'gym_transient',
  notReady: 'gym_not_ready',
  invariant: 'invariant_error',
  storage: 'storage_error',
  /** The trainer holds an older version than expected: re-send the batches after `details.step`. */
  trainerBehind: 'trainer_behind',
  /** The trainer is past the expected version (or applied another batch for it): restore an anchor. */
  trainerAhead: 'trainer_ahead',
} as const;

/**
 * Failure types an activity retry never retries (the same ID would get the same answer): every
 * protocol refusal the error table marks not retryable, plus the activities' own final types.
 */
export const NON_RETRYABLE_ERROR_TYPES: readonly string[] = [
  ...NON_RETRYABLE_CODES,
  FAILURE_TYPES.notReady,
  FAILURE_TYPES.invariant,
  FAILURE_TYPES.trainerBehind,
  FAILURE_TYPES.trainerAhead,
];
