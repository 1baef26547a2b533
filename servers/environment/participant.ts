// The environment participant (participants.md §2.7–2.11, control-plane.md §10 environment row):
// what the control plane asks of an environment server, answered from the episode step tracker,
// the task digests of live episodes and the restored records not yet claimed by a replacement.
import { refuse } from '../../protocol/errors.js';
import { captureKey, nextAttempt, parseCaptureKey, sortedKeys, type CaptureKey, type EpisodeId } from '../../protocol/ids.js';
import type { ControlPlane } from '../control/control-plane.js';
import type { CheckpointRecord } from '../../protocol/manifest.js';
import type { JsonText } from '../../protocol/json-text.js';
import { SteadyObjects } from '../control/ahead.js';
import { builtOnWrite, type ExportRequest, type ExportResult, type InstallRequest, type ParticipantHooks, type ReadinessReport } from '../control/hooks.js';
import type { AttemptReplies } from './attempt-replies.js';
import { EpisodeRecordSchema, toPlainJson, type EpisodeRecord, type StageBoundary } from './boundaries.js';
import { EpisodeSteps, type BeginOptions } from './episode-steps.js';

/** A restored record kept under its replacement's capture key until that replacement begins. */
export interface RestoredEpisode {
  /** The replacement attempt (N+1). */
  episode: EpisodeId;
  task_digest: string;
  boundary: StageBoundary | null;
}

export interface EnvironmentParticipantOptions {
  /** False: the protocol records no boundaries, so every episode is begun as a restart (§2.1). */
  checkpointBoundaries: boolean;
  replies: AttemptReplies;
  /** The agent and resources servers this environment drives (reported in status for discovery). */
  peers?: { agent: string; resources: string };
}

export class EnvironmentParticipant implements ParticipantHooks {
  readonly kind = 'environment' as const;
  readonly steps: EpisodeSteps;
  private plane: ControlPlane | undefined;
  private readonly digests = new Map<CaptureKey, string>();
  private readonly restored = new Map<CaptureKey, RestoredEpisode>();
  /** Set by a restore: replacements, too, wait for the resume that follows it (§2.8). */
  private restoreHold = false;

  private readonly parsedRecords = new WeakMap<CheckpointRecord, EpisodeRecord>();
  /** Boundaries seen by an earlier `stageAhead` scan. */
  private readonly steady = new SteadyObjects();

  constructor(private readonly opts: EnvironmentParticipantOptions) {
    this.steps = new EpisodeSteps(() => this.plane?.notify());
  }

  /** The control plane, once mounted (none when checkpointing is off). */
  attach(plane: ControlPlane | undefined): void {
    this.plane = plane;
  }

  get controlPlane(): ControlPlane | undefined {
    return this.plane;
  }

  // --- data plane -------------------------------------------------------------------------

  isRetired(e: EpisodeId): boolean {
    return this.plane?.isRetired(e) ?? false;
  }

  /**
   * §2.7 step 3, in order: retire mark, admission, restored task digest, duplicate; then registers
   * the episode with its restored boundary as continuation. A refused begin owns nothing.
   */
  begin(episode: EpisodeId, digest: string, opts: Omit<BeginOptions, 'continuation' | 'restart'>): StageBoundary | null {
    const key = captureKey(episode);
    this.plane?.assertNotRetired(episode);
    const restored = this.restored.get(key);
    if (this.steps.closed && (!restored || this.restoreHold)) {
      throw refuse('admission_closed', `episode admission is closed for a checkpoint; retry ${key} after resume`);
    }
    if (restored && restored.task_digest !== digest) {
      throw refuse('checkpoint_error', `episode ${key} continues a checkpoint recorded for a different task`);
    }
    if (this.steps.has(key)) throw refuse('checkpoint_error', `episode ${key} is already running`);
    const continuation = restored?.boundary ?? null;
    this.steps.begin(key, { ...opts, continuation, restart: !this.opts.checkpointBoundaries });
    this.restored.delete(key);
    this.digests.set(key, digest);
    return this.steps.continuation(key) as StageBoundary | null;
  }

  /** §2.7 step 7: untrack the episode, then its digest. */
  end(key: CaptureKey): void {
    this.steps.end(key);
    this.digests.delete(key);
  }

  restoredPending(): CaptureKey[] {
    return sortedKeys(this.restored.keys());
  }

  // --- hooks ------------------------------------------------------------------------------

  closeAdmission(): void {
    this.steps.close();
  }

  openAdmission(): void {
    this.restoreHold = false;
    this.steps.open();
  }

  ready(carried: ReadonlySet<CaptureKey>): boolean {
    return this.steps.ready(carried);
  }

  report(carried: ReadonlySet<CaptureKey>): ReadinessReport {
    return {
      blockers: this.steps.blockers().filter((k) => !carried.has(k)),
      counts: { episodes: this.steps.size },
      restarts: this.steps.restarts(),
    };
  }

  async export(req: ExportRequest): Promise<ExportResult> {
    const inScope = req.scope ? new Set(req.scope.map(captureKey)) : undefined;
    const exported: { key: CaptureKey; digest: string; boundary: JsonText | null }[] = [];
    for (const [key, boundary] of this.steps.exportedTexts()) {
      if (req.carriedRestarts.has(key) || (inScope && !inScope.has(key))) continue;
      const digest = this.digests.get(key);
      if (digest === undefined || !parseCaptureKey(key)) continue;
      exported.push({ key, digest, boundary });
    }
    const live = builtOnWrite(exported, ({ key, digest, boundary }) => ({
      episode_id: parseCaptureKey(key)!,
      task_digest: digest,
      // JSON form: the boundary's payloads as they would travel on the wire, written as that text.
      boundary,
    }));
    // A replacement that has not begun still continues from its restored boundary: a checkpoint
    // taken before it runs carries the record forward under the replacement's key (§2.10).
    const restored: CheckpointRecord[] = [];
    for (const [key, r] of this.restored) {
      if (inScope && !inScope.has(key)) continue;
      restored.push({ episode_id: r.episode, task_digest: r.task_digest, boundary: r.boundary });
    }
    return {
      records: {
        *[Symbol.iterator]() {
          yield* live;
          yield* restored;
        },
      },
    };
  }

  stageAhead(): Iterable<void> {
    return this.steps.stageTexts(this.steady);
  }

  async deleteRestored(scope: readonly EpisodeId[]): Promise<void> {
    const keep = new Set(scope.map(captureKey));
    for (const key of [...this.restored.keys()]) if (!keep.has(key)) this.restored.delete(key);
  }

  assertRestorable(): void {
    if (this.steps.size > 0 || this.restored.size > 0) {
      throw refuse('checkpoint_error', 'environment restore requires a process without live episodes or restored records');
    }
  }

  validateRecord(record: CheckpointRecord): void {
    this.parseRecord(record);
  }

  /** Checked at read, used at install: each record is parsed once. */
  private parseRecord(record: CheckpointRecord): EpisodeRecord {
    const known = this.parsedRecords.get(record);
    if (known) return known;
    const r = EpisodeRecordSchema.safeParse(toPlainJson(record));
    if (!r.success) {
      const issue = r.error.issues[0]!;
      throw new Error(`environment record is malformed at ${issue.path.join('.') || '(root)'}: ${issue.message}`);
    }
    this.parsedRecords.set(record, r.data);
    return r.data;
  }

  async install(req: InstallRequest): Promise<CaptureKey[]> {
    this.assertRestorable();
    const parsed = req.records.map((r) => ({ episode: r.episode_id, record: this.parseRecord(r) }));
    const installed: CaptureKey[] = [];
    for (const { episode, record } of parsed) {
      const replacement = nextAttempt(episode);
      const key = captureKey(replacement);
      this.restored.set(key, { episode: replacement, task_digest: record.task_digest, boundary: record.boundary });
      installed.push(key);
    }
    this.restoreHold = true;
    return installed;
  }

  async retire(targets: readonly EpisodeId[], signal: AbortSignal): Promise<void> {
    const covered = (key: CaptureKey): boolean => {
      const e = parseCaptureKey(key);
      return !!e && targets.some((t) => t.rollout_id === e.rollout_id && e.attempt <= t.attempt);
    };
    for (const key of [...this.restored.keys()]) if (covered(key)) this.restored.delete(key);
    // Each episode stops on its own; one slow cleanup does not hold the others up.
    await Promise.all(
      this.steps
        .keys()
        .filter(covered)
        .map(async (key) => {
          await this.steps.retire(key, signal);
          this.digests.delete(key);
        }),
    );
  }

  assertForgettable(rolloutIds: readonly string[]): void {
    const ids = new Set(rolloutIds);
    const live = this.steps.keys().filter((k) => this.steps.isRetiring(k) && ids.has(parseCaptureKey(k)?.rollout_id ?? k));
    if (live.length) throw refuse('retire_incomplete', `retired episodes are still stopping: ${sortedKeys(live).join(', ')}`);
  }

  forget(rolloutIds: readonly string[]): void {
    this.opts.replies.forget(rolloutIds);
  }

  statusExtras(): Record<string, unknown> {
    return { restored_pending: this.restoredPending(), ...(this.opts.peers ? { capabilities: { ...this.opts.peers } } : {}) };
  }
}
