// What the control plane asks of a participant kind. The plane owns phases, fencing, the
// lease, replay, retire marks and storage; a kind answers only these questions about the
// state it owns (environment episodes, agent sessions, resources sessions, model ledgers).
import type { CaptureKey, EpisodeId, Kind } from '../../protocol/ids.js';
import type { CheckpointRecord, Manifest } from '../../protocol/manifest.js';

export interface ReadinessReport {
  /** Every blocker (uncapped; the plane sorts and caps at 100). */
  blockers: Iterable<string>;
  counts: Record<string, number>;
  /** In-flight episodes this participant cannot capture (never capped, never block). */
  restarts: Iterable<CaptureKey>;
}

export interface ExportRequest {
  checkpointId: string;
  /** Episodes the controller continues; null = export everything, delete nothing. */
  scope: readonly EpisodeId[] | null;
  /** Restarts other participants reported at earlier prepare stages: never exported. */
  carriedRestarts: ReadonlySet<CaptureKey>;
  /** Aborted when resume cancels a still-running export. */
  signal: AbortSignal;
}

export interface ExportResult {
  /**
   * Iterated by the write, once per attempt of it, in order: a kind may build each record only when
   * the write takes it (`builtOnWrite`), so that it lives only until it is encoded.
   */
  records: Iterable<CheckpointRecord>;
  /** Kind-specific manifest fields (read back at restore). */
  manifestExtras?: Record<string, unknown>;
  /** Kind-specific commit reply fields (e.g. the model's `staging_keys`). */
  replyExtras?: Record<string, unknown>;
}

export interface InstallRequest {
  /** Verified in-scope records, as checkpointed (attempt N). */
  records: CheckpointRecord[];
  /** The full restore scope (attempt N), including episodes without a record here. */
  scope: readonly EpisodeId[];
  manifest: Manifest;
}

export interface ParticipantHooks {
  readonly kind: Kind;
  /** Close the data plane. A throw fails prepare/restore and admission is reopened. */
  closeAdmission(): void | Promise<void>;
  /** Reopen the data plane; parked work continues. */
  openAdmission(): void | Promise<void>;
  /** Cheap readiness: every live execution at a committable boundary (restarts and carried restarts excluded). */
  ready(carriedRestarts: ReadonlySet<CaptureKey>): boolean;
  /** The full report, built once per prepare reply and per status call. */
  report(carriedRestarts: ReadonlySet<CaptureKey>): ReadinessReport;
  /** Exactly once per checkpoint: only scope episodes, never restarts or episodes being retired. */
  export(req: ExportRequest): Promise<ExportResult>;
  /** Free restored state the scope leaves out, without fencing its attempt (§5.4 step 7). */
  deleteRestored?(scope: readonly EpisodeId[]): Promise<void>;
  /** After a `stop` commit is durable: free out-of-process compute (best effort, never raised). */
  releaseAfterStop?(): Promise<void>;
  /** Throw `checkpoint_error` when the process holds live state and must not be restored into. */
  assertRestorable(): void;
  /** Validate one in-scope record before install (a throw names the episode). */
  validateRecord?(record: CheckpointRecord): void;
  /**
   * A record field restore hands to `install` unparsed (`DeferredJson`): its lines are parsed and
   * checked on worker threads, the objects built on first use (storage/reader.ts `defer`).
   */
  readonly deferredRecordField?: string;
  /** Install records under attempt N+1; returns the replacement capture keys installed. */
  install(req: InstallRequest): Promise<CaptureKey[]>;
  /**
   * Stop the running work of each attempt and every earlier one, wait until it stopped, free its
   * state (live or restored). Marks are already raised. Work not stopped when `signal` aborts
   * stays tracked so a retried retire finds it.
   */
  retire(episodes: readonly EpisodeId[], signal: AbortSignal): Promise<void>;
  /** Throw `retire_incomplete` when forgetting would make retired state live again. */
  assertForgettable?(rolloutIds: readonly string[]): void;
  /** Drop kind-specific retired bookkeeping of these rollouts. */
  forget?(rolloutIds: readonly string[]): void;
  /** Kind-specific status fields (e.g. `restored_pending`, `mode`, `verify`). */
  statusExtras?(): Record<string, unknown>;
  /**
   * Work of a future export done ahead (ahead.ts): the text of each record whose boundary has not
   * moved since the previous call, one record per step. The plane iterates it in short slices
   * while no checkpoint is open and drops it when one opens; what it made must be exactly what
   * the export would make.
   */
  stageAhead?(): Iterable<unknown>;
}

/**
 * The records of `items` (chosen at export), each built when the write takes it. Built all at once,
 * the records of a server holding thousands of episodes outlived the young generation's collections
 * while the write encoded them, and the old generation they filled was collected, whole, inside
 * nearly every checkpoint (docs/performance.md). A kept episode does not change while admission is
 * closed, so building it later builds the same record.
 */
export function builtOnWrite<T>(items: readonly T[], build: (item: T) => CheckpointRecord): Iterable<CheckpointRecord> {
  return {
    *[Symbol.iterator]() {
      for (const item of items) yield build(item);
    },
  };
}
