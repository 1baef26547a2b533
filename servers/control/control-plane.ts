// One participant's checkpoint control plane (control-plane.md §5, §8): the phase machine,
// checkpoint-ID fencing, idempotent replay, the lease, retire marks, and one export / one write /
// one cleanup per checkpoint. It knows nothing about episodes, sessions or ledgers: it asks the
// participant kind through its hooks.
import { randomUUID } from 'node:crypto';
import { refuse, ProtocolError } from '../../protocol/errors.js';
import { captureKey, sortedKeys, type CaptureKey, type EpisodeId, type Kind } from '../../protocol/ids.js';
import {
  buildReport,
  scopeKey,
  type CheckpointRequest,
  type CommitReply,
  type CommitRequest,
  type ForgetReply,
  type ForgetRequest,
  type Phase,
  type PrepareReply,
  type PrepareReport,
  type PrepareRequest,
  type RenewReply,
  type RestoreReply,
  type RestoreRequest,
  type ResumeReply,
  type RetireReply,
  type RetireRequest,
  type StatusReply,
} from '../../protocol/control.js';
import type { CheckpointRecord, Manifest } from '../../protocol/manifest.js';
import { AheadStaging } from './ahead.js';
import { collectAfterRelease } from './collect-after-release.js';
import { boundByDeadline, deadlineSignal, nowSeconds } from './deadline.js';
import type { ExportResult, ParticipantHooks } from './hooks.js';
import { Mutex } from '../common/async.js';
import type { ControlMetrics, GymMetrics, TimedOperation } from '../common/metrics.js';
import { ResumedIds } from './resumed-ids.js';
import { RetireMarks } from './retire-marks.js';
import { readRecords } from './storage/reader.js';
import { startRecordsWrite, type RecordsWrite } from './storage/writer.js';

export interface ControlPlaneOptions {
  instance: string;
  hooks: ParticipantHooks;
  leaseGraceSeconds?: number;
  /** How often a failed automatic reopen is retried (§8.6: 30 s). */
  leaseRetryMs?: number;
  /** Upper bound between readiness re-checks while prepare waits (§5.2: ≤ 1 s). */
  readinessPollMs?: number;
  log?: (msg: string, err?: unknown) => void;
  /** The server's metrics: the plane records its operations there. */
  metrics?: GymMetrics;
}

/** The one commit in progress or done for the active checkpoint ID. */
interface CommitState {
  id: string;
  dir: string;
  scopeKey: string;
  scope: readonly EpisodeId[] | null;
  stop: boolean;
  exportAbort: AbortController;
  exportTask: Promise<ExportResult>;
  write?: RecordsWrite;
  writeTask?: Promise<Manifest>;
  /** The episodes of the records the write took, in order. */
  episodes?: CaptureKey[];
  cleanupTask?: Promise<void>;
  /** Set by resume: nothing of this commit may start writing afterwards. */
  cancelled?: boolean;
  /** Set once the commit can never succeed for this ID (Latest: `export_failed` is final). */
  finalError?: ProtocolError;
  reply?: CommitReply;
}

interface RestoreState {
  id: string;
  dir: string;
  scopeKey: string;
  reply: RestoreReply;
}

let serverInstanceId: string | undefined;

/**
 * A worker of a multi-worker server (servers/workers) takes its server's identity: the controller,
 * and the environment's `x-ng-instance-id` check, see one instance, however many workers serve it.
 */
export function adoptServerInstanceId(id: string): void {
  serverInstanceId = id;
}

export class ControlPlane {
  readonly instance: string;
  readonly kind: Kind;
  readonly hooks: ParticipantHooks;
  readonly marks = new RetireMarks();
  /**
   * Ours (beyond Gym): identifies this process, so a controller can tell a participant that came
   * back fresh after a crash from one that kept its state.
   */
  readonly instanceId = serverInstanceId ?? randomUUID();

  private phase: Phase = 'idle';
  private checkpointId: string | null = null;
  private leaseExpiresAt: number | null = null;
  private leaseTimer: NodeJS.Timeout | undefined;
  private readonly leaseGraceSeconds: number;
  private readonly leaseRetryMs: number;
  private readonly readinessPollMs: number;
  private readonly log: (msg: string, err?: unknown) => void;

  private readonly mutex = new Mutex();
  private readonly resumed = new ResumedIds();
  private carried = new Set<CaptureKey>();
  private preparedReply: { id: string; reply: PrepareReply } | undefined;
  private commitState: CommitState | undefined;
  private restoreState: RestoreState | undefined;
  /** An install still running after its restore call gave up; the next restore/retire waits for it. */
  private installTask: Promise<unknown> | undefined;
  /** Admission left closed by a failed restore whose install was still running (§5.6 step 2). */
  private reopenPending = false;
  /** Identifies the latest restore, so a failed one reopens admission only if none took over. */
  private restoreTicket: symbol | undefined;
  private changeWaiters: Array<() => void> = [];
  private closed = false;
  private readonly metrics: ControlMetrics | undefined;
  /** When admission was closed (performance.now()), until it reopens. */
  private closedAt: number | undefined;
  private readonly ahead: AheadStaging | undefined;

  constructor(opts: ControlPlaneOptions) {
    this.instance = opts.instance;
    this.hooks = opts.hooks;
    this.kind = opts.hooks.kind;
    this.leaseGraceSeconds = opts.leaseGraceSeconds ?? 600;
    this.leaseRetryMs = opts.leaseRetryMs ?? 30_000;
    this.readinessPollMs = opts.readinessPollMs ?? 1_000;
    this.log = opts.log ?? (() => undefined);
    if (!(this.leaseGraceSeconds > 0)) throw new Error('lease_grace_seconds must be > 0');
    this.metrics = opts.metrics?.control(this);
    const stage = opts.hooks.stageAhead?.bind(opts.hooks);
    this.ahead = stage && new AheadStaging({ stage, idle: () => this.admissionOpen(), log: this.log });
  }

  /** No checkpoint open, admission open, the plane running: the kind may stage records ahead. */
  private admissionOpen(): boolean {
    return !this.closed && this.phase === 'idle' && this.closedAt === undefined;
  }

  // --- data-plane helpers for the participant kind -------------------------------------

  /** Wakes a waiting prepare: call on every state change that may make the participant ready. */
  notify(): void {
    const w = this.changeWaiters;
    this.changeWaiters = [];
    for (const wake of w) wake();
  }

  /** True when this attempt was retired here (a data-plane request of it gets `stale_attempt`). */
  isRetired(e: EpisodeId): boolean {
    return this.marks.isRetired(e);
  }

  assertNotRetired(e: EpisodeId): void {
    if (this.marks.isRetired(e)) {
      throw refuse('stale_attempt', `attempt ${captureKey(e)} was retired (mark ${this.marks.markOf(e.rollout_id)})`);
    }
  }

  get currentPhase(): Phase {
    return this.phase;
  }

  get activeCheckpointId(): string | null {
    return this.checkpointId;
  }

  get carriedRestarts(): ReadonlySet<CaptureKey> {
    return this.carried;
  }

  /** Stops the lease timer (server shutdown). */
  close(): void {
    this.closed = true;
    clearTimeout(this.leaseTimer);
    this.ahead?.stop();
  }

  // --- status -----------------------------------------------------------------------------

  currentReport(): PrepareReport {
    const r = this.hooks.report(this.carried);
    return buildReport({ ready: this.hooks.ready(this.carried), blockers: r.blockers, counts: r.counts, restarts: r.restarts });
  }

  status(): StatusReply {
    return {
      kind: this.kind,
      instance: this.instance,
      phase: this.phase,
      checkpoint_id: this.checkpointId,
      lease_expires_at: this.leaseExpiresAt,
      retired_rollouts: this.marks.size,
      report: this.currentReport(),
      instance_id: this.instanceId,
      ...(this.hooks.statusExtras?.() ?? {}),
    };
  }

  // --- fencing (§8.3) ---------------------------------------------------------------------

  private admit(id: string, allowed: readonly Phase[]): void {
    if (this.resumed.has(id)) throw refuse('stale_checkpoint', `checkpoint '${id}' was already resumed`);
    if (this.checkpointId !== null && this.checkpointId !== id) {
      throw refuse('checkpoint_conflict', `checkpoint '${this.checkpointId}' is active in phase ${this.phase}`);
    }
    if (!allowed.includes(this.phase)) {
      throw refuse('invalid_phase', `operation not allowed in phase ${this.phase}`);
    }
  }

  /** Retire and forget: only outside an open checkpoint; in `restored` only with the restore's ID. */
  private admitCleanup(id: string, op: string): void {
    if (this.phase !== 'idle' && this.phase !== 'restored') {
      throw refuse('invalid_phase', `${op} is not allowed while checkpoint '${this.checkpointId}' is open (phase ${this.phase}); resume first`);
    }
    if (this.phase === 'restored' && this.checkpointId !== id) {
      throw refuse('checkpoint_conflict', `restore '${this.checkpointId}' is active; ${op} must use its ID`);
    }
  }

  // --- lease (§8.6) -------------------------------------------------------------------------

  private extendLease(deadlineTs: number): void {
    const target = deadlineTs + this.leaseGraceSeconds;
    this.leaseExpiresAt = Math.max(this.leaseExpiresAt ?? 0, target);
    this.armLease(this.leaseExpiresAt * 1000 - Date.now());
  }

  private armLease(ms: number): void {
    clearTimeout(this.leaseTimer);
    if (this.closed) return;
    const id = this.checkpointId;
    // setTimeout caps at ~24.8 days; longer leases re-arm when the timer fires early.
    this.leaseTimer = setTimeout(() => void this.onLeaseTimer(id), Math.min(Math.max(0, ms), 2 ** 31 - 1));
    this.leaseTimer.unref();
  }

  private async onLeaseTimer(id: string | null): Promise<void> {
    if (id === null || this.checkpointId !== id || this.leaseExpiresAt === null) return;
    const left = this.leaseExpiresAt * 1000 - Date.now();
    if (left > 0) return this.armLease(left);
    try {
      await this.mutex.run(async () => {
        if (this.checkpointId !== id) return;
        this.log(`lease of checkpoint '${id}' expired; resuming on our own`);
        await this.reopen(id, Number.POSITIVE_INFINITY);
      });
    } catch (err) {
      // Latest: retry after any error, letting a controller's resume in meanwhile.
      this.log(`automatic reopen of '${id}' failed; retrying in ${this.leaseRetryMs} ms`, err);
      clearTimeout(this.leaseTimer);
      if (this.closed) return;
      this.leaseTimer = setTimeout(() => void this.onLeaseTimer(id), this.leaseRetryMs);
      this.leaseTimer.unref();
    }
  }

  // --- prepare (§5.2) -----------------------------------------------------------------------

  prepare(req: PrepareRequest): Promise<PrepareReply> {
    return this.timed('prepare', (working) => this.handlePrepare(req, working));
  }

  private async handlePrepare(req: PrepareRequest, working: () => void): Promise<PrepareReply> {
    const id = req.checkpoint_id;
    const started = await this.mutex.run(async () => {
      if (this.preparedReply?.id === id) return { replay: this.preparedReply.reply };
      this.admit(id, ['idle', 'preparing']);
      working();
      if (this.phase === 'idle') {
        this.checkpointId = id;
        this.phase = 'preparing';
        this.extendLease(req.deadline_ts);
        try {
          await this.closeAdmission();
        } catch (err) {
          // Not fenced: the same ID may be retried.
          await this.safeOpenAdmission();
          this.toIdle();
          throw err;
        }
      } else {
        this.extendLease(req.deadline_ts);
      }
      for (const k of req.restarts ?? []) this.carried.add(k);
      return undefined;
    });
    if (started) return started.replay;

    try {
      await this.waitReady(id, req.deadline_ts);
    } catch (err) {
      await this.mutex.run(async () => {
        if (this.checkpointId === id && this.phase === 'preparing') {
          await this.safeOpenAdmission();
          this.toIdle();
        }
      });
      throw err;
    }

    return this.mutex.run(() => {
      if (this.preparedReply?.id === id) return this.preparedReply.reply;
      if (this.checkpointId !== id || this.phase !== 'preparing') {
        return { phase: this.phase, report: this.currentReport() };
      }
      const report = this.currentReport();
      if (!report.ready) return { phase: 'preparing' as Phase, report };
      this.phase = 'prepared';
      const reply: PrepareReply = { phase: 'prepared', report };
      this.preparedReply = { id, reply };
      return reply;
    });
  }

  /** Until ready, the deadline, or the active checkpoint changes; re-checks at least once a second. */
  private async waitReady(id: string, deadlineTs: number): Promise<void> {
    for (;;) {
      if (this.checkpointId !== id || this.phase !== 'preparing') return;
      if (this.hooks.ready(this.carried)) return;
      const left = deadlineTs * 1000 - Date.now();
      if (left <= 0) return;
      await new Promise<void>((resolve) => {
        const t = setTimeout(done, Math.min(left, this.readinessPollMs));
        function done(): void {
          clearTimeout(t);
          resolve();
        }
        this.changeWaiters.push(done);
      });
    }
  }

  // --- renew (§5.3) -------------------------------------------------------------------------

  async renew(req: CheckpointRequest): Promise<RenewReply> {
    return this.mutex.run(() => {
      this.admit(req.checkpoint_id, ['preparing', 'prepared', 'committed', 'restored']);
      this.extendLease(req.deadline_ts);
      return { lease_expires_at: this.leaseExpiresAt! };
    });
  }

  // --- commit (§5.4) ------------------------------------------------------------------------

  commit(req: CommitRequest): Promise<CommitReply> {
    return this.timed('commit', (working) => this.handleCommit(req, working));
  }

  private async handleCommit(req: CommitRequest, working: () => void): Promise<CommitReply> {
    const id = req.checkpoint_id;
    const scope = req.episode_ids;
    const key = scopeKey(scope);
    const state = await this.mutex.run(() => {
      const existing = this.commitState;
      if (existing && existing.id === id && !this.resumed.has(id)) {
        if (existing.dir !== req.checkpoint_dir || existing.scopeKey !== key) {
          throw refuse('checkpoint_conflict', `checkpoint '${id}' was committed with another directory or scope`);
        }
        if (existing.reply) return existing;
        if (existing.finalError) throw existing.finalError;
        // A retry waits for the same export and write.
        working();
        this.extendLease(req.deadline_ts);
        return existing;
      }
      this.admit(id, ['prepared']);
      working();
      this.extendLease(req.deadline_ts);
      if (!this.hooks.ready(this.carried)) {
        // Latest: a regressed readiness ends this checkpoint for good.
        const err = refuse('export_failed', `participant is no longer ready to commit checkpoint '${id}'`);
        this.commitState = this.newCommitState(req, key, Promise.reject(err));
        this.commitState.finalError = err;
        throw err;
      }
      if (scope) {
        const restarts = new Set(this.hooks.report(this.carried).restarts);
        const hit = scope.map(captureKey).filter((k) => restarts.has(k));
        if (hit.length) throw refuse('restart_in_scope', `scope names restarts of this participant: ${sortedKeys(hit).join(', ')}`);
      }
      const exportAbort = new AbortController();
      const exportTask = this.hooks.export({ checkpointId: id, scope, carriedRestarts: new Set(this.carried), signal: exportAbort.signal });
      this.commitState = { ...this.newCommitState(req, key, exportTask), exportAbort };
      exportTask.catch((err: unknown) => {
        if (this.commitState?.id === id && !this.commitState.finalError) {
          this.commitState.finalError = refuse('export_failed', `export of checkpoint '${id}' failed: ${describe(err)}`);
        }
      });
      return this.commitState;
    });
    if (state.reply) return state.reply;
    return boundByDeadline(this.runCommit(state), req.deadline_ts, `commit of checkpoint '${id}'`);
  }

  private newCommitState(req: CommitRequest, key: string, exportTask: Promise<ExportResult>): CommitState {
    exportTask.catch(() => undefined);
    return {
      id: req.checkpoint_id,
      dir: req.checkpoint_dir,
      scopeKey: key,
      scope: req.episode_ids,
      stop: req.stop,
      exportAbort: new AbortController(),
      exportTask,
    };
  }

  /** Export → write → cleanup, each started once; a retry awaits the same tasks. */
  private async runCommit(state: CommitState): Promise<CommitReply> {
    let exported: ExportResult;
    try {
      exported = await state.exportTask;
    } catch (err) {
      throw state.finalError ?? refuse('export_failed', `export of checkpoint '${state.id}' failed: ${describe(err)}`);
    }
    if (state.cancelled) throw refuse('checkpoint_conflict', `checkpoint '${state.id}' was resumed before its write started`);
    if (!state.writeTask) {
      // A retry after a failed write stores the same exported records again. The reply names the
      // episodes of the records written, taken as the write takes them (they may be built only then).
      const episodes: CaptureKey[] = [];
      state.episodes = episodes;
      const write = startRecordsWrite({
        checkpointDir: state.dir,
        kind: this.kind,
        instance: this.instance,
        checkpointId: state.id,
        records: episodesTaken(exported.records, episodes),
        extras: exported.manifestExtras,
      });
      state.write = write;
      state.writeTask = write.done;
      write.done.catch(() => {
        if (state.write === write) {
          state.write = undefined;
          state.writeTask = undefined;
        }
      });
    }
    const manifest = await state.writeTask;
    if (!state.cleanupTask) {
      const scope = state.scope;
      state.cleanupTask = scope && this.hooks.deleteRestored ? this.hooks.deleteRestored(scope) : Promise.resolve();
      state.cleanupTask.catch(() => {
        if (state.cleanupTask) state.cleanupTask = undefined;
      });
    }
    await state.cleanupTask;
    if (state.stop && this.hooks.releaseAfterStop) {
      await this.hooks.releaseAfterStop().catch((err) => this.log('releasing compute after stop failed', err));
    }
    return this.mutex.run(() => {
      if (state.reply) return state.reply;
      if (this.commitState !== state || this.checkpointId !== state.id || this.phase !== 'prepared') {
        throw refuse('checkpoint_conflict', `checkpoint '${state.id}' is no longer active`);
      }
      const reply: CommitReply = {
        phase: 'committed',
        manifest,
        episode_ids: sortedKeys(state.episodes ?? []),
        ...(exported.replyExtras ?? {}),
      };
      state.reply = reply;
      this.phase = 'committed';
      this.metrics?.recordsExported(state.episodes?.length ?? 0);
      return reply;
    });
  }

  // --- restore (§5.5) -----------------------------------------------------------------------

  restore(req: RestoreRequest): Promise<RestoreReply> {
    return this.timed('restore', (working) => this.handleRestore(req, working));
  }

  private async handleRestore(req: RestoreRequest, working: () => void): Promise<RestoreReply> {
    const id = req.checkpoint_id;
    const key = scopeKey(req.episode_ids);
    return this.mutex.run(async () => {
      const rec = this.restoreState;
      if (rec && rec.id === id && this.checkpointId === id) {
        if (rec.dir !== req.checkpoint_dir || rec.scopeKey !== key) {
          throw refuse('checkpoint_conflict', `restore '${id}' was done with another directory or scope`);
        }
        return rec.reply;
      }
      this.admit(id, ['idle']);
      working();
      // Latest: a harness of the crashed attempt that is still alive is refused everywhere,
      // even if this restore fails below.
      this.marks.markAll(req.episode_ids);
      this.hooks.assertRestorable();

      const scopeKeys = new Set(req.episode_ids.map(captureKey));
      const { manifest, records } = await boundByDeadline(
        readRecords({
          checkpointDir: req.checkpoint_dir,
          kind: this.kind,
          instance: this.instance,
          scope: scopeKeys,
          validate: (r) => this.hooks.validateRecord?.(r),
          defer: this.hooks.deferredRecordField,
        }),
        req.deadline_ts,
        'reading the checkpoint',
      );
      if (this.installTask) await boundByDeadline(this.installTask, req.deadline_ts, 'a previous install');

      const ticket = Symbol('restore');
      this.restoreTicket = ticket;
      let install: Promise<CaptureKey[]>;
      try {
        await this.closeAdmission();
        install = this.hooks.install({ records, scope: req.episode_ids, manifest });
      } catch (err) {
        await this.safeOpenAdmission();
        throw err;
      }
      const tracked = install.finally(() => {
        if (this.installTask === tracked) this.installTask = undefined;
      });
      this.installTask = tracked;
      tracked.catch(() => undefined);
      let restored: CaptureKey[];
      try {
        restored = await boundByDeadline(install, req.deadline_ts, 'installing the checkpoint');
      } catch (err) {
        // Reopen only once the install has stopped, and only if no later restore took over.
        this.reopenPending = true;
        void tracked
          .catch(() => undefined)
          .then(() =>
            this.mutex.run(async () => {
              if (this.reopenPending && this.restoreTicket === ticket && this.phase === 'idle') {
                this.reopenPending = false;
                await this.safeOpenAdmission();
              }
            }),
          );
        throw err;
      }
      this.reopenPending = false;
      this.checkpointId = id;
      this.phase = 'restored';
      this.extendLease(req.deadline_ts);
      const reply: RestoreReply = {
        phase: 'restored',
        source_checkpoint_id: manifest.checkpoint_id,
        restored: sortedKeys(restored),
      };
      this.restoreState = { id, dir: req.checkpoint_dir, scopeKey: key, reply };
      this.metrics?.recordsRestored(records.length);
      return reply;
    });
  }

  // --- resume (§5.6) ------------------------------------------------------------------------

  resume(req: CheckpointRequest): Promise<ResumeReply> {
    return this.timed('resume', (working) => this.handleResume(req, working));
  }

  private async handleResume(req: CheckpointRequest, working: () => void): Promise<ResumeReply> {
    const id = req.checkpoint_id;
    return this.mutex.run(async () => {
      if (this.resumed.has(id)) return { phase: 'idle', idempotent: true };
      if (this.phase === 'idle' && this.checkpointId === null) {
        // Fences a delayed prepare of an aborted checkpoint that never reached this participant.
        this.resumed.add(id);
        if (this.reopenPending) {
          this.reopenPending = false;
          await this.openAdmission();
        }
        return { phase: 'idle', idempotent: true };
      }
      this.admit(id, ['preparing', 'prepared', 'committed', 'restored']);
      working();
      await this.reopen(id, req.deadline_ts);
      return { phase: 'idle', idempotent: false };
    });
  }

  /** Resume proper (explicit or by lease expiry). Runs under the lock. */
  private async reopen(id: string, deadlineTs: number): Promise<void> {
    const state = this.commitState?.id === id ? this.commitState : undefined;
    if (state) {
      state.cancelled = true;
      // Once stop() returns no manifest of this write can appear.
      await state.write?.stop();
      state.exportAbort.abort(refuse('checkpoint_conflict', `checkpoint '${id}' was resumed`));
      if (state.cleanupTask) await boundByDeadline(state.cleanupTask, deadlineTs, 'cleanup of unscoped restored state');
    }
    await this.openAdmission();
    this.resumed.add(id);
    this.toIdle();
    if (state?.write) collectAfterRelease(() => this.admissionOpen());
  }

  private toIdle(): void {
    if (this.checkpointId !== null && this.commitState?.id === this.checkpointId) this.commitState = undefined;
    if (this.preparedReply?.id === this.checkpointId) this.preparedReply = undefined;
    if (this.restoreState?.id === this.checkpointId) this.restoreState = undefined;
    this.phase = 'idle';
    this.checkpointId = null;
    this.leaseExpiresAt = null;
    this.carried = new Set();
    clearTimeout(this.leaseTimer);
    this.notify();
  }

  private async safeOpenAdmission(): Promise<void> {
    try {
      await this.openAdmission();
    } catch (err) {
      this.log('reopening admission failed', err);
    }
  }

  // --- metrics --------------------------------------------------------------------------------

  private async closeAdmission(): Promise<void> {
    await this.hooks.closeAdmission();
    this.closedAt ??= performance.now();
  }

  private async openAdmission(): Promise<void> {
    await this.hooks.openAdmission();
    if (this.closedAt !== undefined) this.metrics?.admissionReopened((performance.now() - this.closedAt) / 1000);
    this.closedAt = undefined;
  }

  /** Times the whole call; observed only once it calls `working` (past replay and fencing). */
  private async timed<T>(op: TimedOperation, call: (working: () => void) => Promise<T>): Promise<T> {
    const metrics = this.metrics;
    if (!metrics) return call(() => undefined);
    const start = performance.now();
    let worked = false;
    try {
      return await call(() => {
        worked = true;
      });
    } finally {
      if (worked) metrics.operation(op, (performance.now() - start) / 1000);
    }
  }

  // --- retire and forget (§5.7, §5.8) -------------------------------------------------------

  async retire(req: RetireRequest): Promise<RetireReply> {
    const id = req.checkpoint_id;
    // Marks first, before any await: they persist even when the rest of the retire fails.
    this.admitCleanup(id, 'retire');
    this.marks.markAll(req.episode_ids);
    if (this.phase === 'restored') this.extendLease(req.deadline_ts);
    if (this.installTask)
      await boundByDeadline(
        this.installTask.catch(() => undefined),
        req.deadline_ts,
        'a running install',
      );
    // One stop per rollout, through its latest named attempt.
    const latest = new Map<string, EpisodeId>();
    for (const e of req.episode_ids) {
      const cur = latest.get(e.rollout_id);
      if (!cur || e.attempt > cur.attempt) latest.set(e.rollout_id, e);
    }
    const { signal, dispose } = deadlineSignal(req.deadline_ts);
    try {
      await boundByDeadline(this.hooks.retire([...latest.values()], signal), req.deadline_ts, 'retire');
    } finally {
      dispose();
      this.notify();
    }
    return { retired_count: req.episode_ids.length };
  }

  async forget(req: ForgetRequest): Promise<ForgetReply> {
    this.admitCleanup(req.checkpoint_id, 'forget');
    if (nowSeconds() > req.deadline_ts) throw refuse('deadline_exceeded', 'deadline passed before forget');
    this.hooks.assertForgettable?.(req.rollout_ids);
    if (this.phase === 'restored') this.extendLease(req.deadline_ts);
    this.marks.forget(req.rollout_ids);
    this.hooks.forget?.(req.rollout_ids);
    return { forgotten_count: req.rollout_ids.length };
  }
}

function describe(err: unknown): string {
  if (err instanceof ProtocolError) return err.detail;
  return err instanceof Error ? err.message : String(err);
}

/** `records` as the write takes them; each episode is noted once the write has accepted its record. */
function episodesTaken(records: Iterable<CheckpointRecord>, episodes: CaptureKey[]): Iterable<CheckpointRecord> {
  return {
    *[Symbol.iterator]() {
      episodes.length = 0;
      for (const record of records) {
        yield record;
        episodes.push(captureKey(record.episode_id as EpisodeId));
      }
    },
  };
}
