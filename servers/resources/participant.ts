// The resources participant (participants.md §4.2–4.6): which sessions belong to which episode,
// what is in flight, what a retire has marked, and the control-plane hooks over that state.
// No Fastify here: `base.ts` feeds it one `RequestTicket` per data-plane request.
import { refuse, ProtocolError } from '../../protocol/errors.js';
import { captureKey, nextAttempt, type CaptureKey, type EpisodeId } from '../../protocol/ids.js';
import { AdmissionGate } from '../common/async.js';
import { deferMinBytes } from '../control/storage/reader.js';
import { materialized } from '../../protocol/deferred-json.js';
import type { CheckpointRecord } from '../../protocol/manifest.js';
import type { ExportRequest, ExportResult, InstallRequest, ParticipantHooks, ReadinessReport } from '../control/hooks.js';

export const CHECKPOINT_MODES = ['stateless', 'exported', 'restart_only'] as const;
export type CheckpointMode = (typeof CHECKPOINT_MODES)[number];
export const CHECKPOINT_VERIFIES = ['wait', 'replay'] as const;
export type CheckpointVerify = (typeof CHECKPOINT_VERIFIES)[number];

export const SEED_PATH = '/seed_session';
export const VERIFY_PATH = '/verify';
export const CLOSE_PATH = '/close_session';

/** The three session hooks an `exported` server implements (§4.6). */
export interface SessionStateHooks {
  /** id → JSON state; an id missing from the result counts as already dropped (not a failure). */
  exportSessionStates(sessionIds: readonly string[]): Promise<ReadonlyMap<string, unknown>> | ReadonlyMap<string, unknown>;
  /**
   * Validate every state first, then install all; a throw installs nothing. With
   * `deferredStates` the values may be `DeferredJson` (already checked to be JSON; a small records
   * file is read eagerly and gives plain values): a server whose states are large keeps them
   * unparsed until a session is used, and reads each with `materialized(v)`, which takes both.
   */
  restoreSessionStates(states: ReadonlyMap<string, unknown>): Promise<void> | void;
  readonly deferredStates?: boolean;
  /** Free one session's state; must tolerate repeats (a retried retire calls it again). */
  retireSessionState(sessionId: string): Promise<void> | void;
}

/** What the plane knows that the participant asks about: retire marks. */
export interface RetireMarkView {
  isRetired(e: EpisodeId): boolean;
  notify(): void;
}

/** One data-plane request as the participant sees it. */
export interface RequestTicket {
  readonly path: string;
  readonly sessionId: string;
  /** From the `/ng-rollout/<key>` prefix, when there was one. */
  readonly episode: EpisodeId | undefined;
  readonly replayable: boolean;
  seedKey?: CaptureKey;
  countedSession: boolean;
  countedGlobal: boolean;
  released: boolean;
}

interface TrackedSession {
  episode: EpisodeId;
  /** Installed by a restore and not used yet by its replacement attempt. */
  restored: boolean;
}

export interface ResourcesParticipantOptions {
  mode: CheckpointMode;
  verify: CheckpointVerify;
  stateHooks?: SessionStateHooks;
  log?: (msg: string, detail?: unknown) => void;
  /** Group-scored verification (e.g. genrm_compare): reported in status so a controller lowers levels. */
  groupScored?: GroupScoring;
}

/** A group-scored server's cohort size and collection deadline (controller.md §5.6 rule 1). */
export interface GroupScoring {
  group_size: number;
  cohort_collection_timeout_s: number | null;
}

export class ResourcesParticipant implements ParticipantHooks {
  readonly kind = 'resources' as const;
  readonly mode: CheckpointMode;
  readonly verify: CheckpointVerify;
  readonly gate = new AdmissionGate();

  private marks: RetireMarkView | undefined;
  private readonly stateHooks: SessionStateHooks | undefined;
  private readonly log: (msg: string, detail?: unknown) => void;

  /** Sessions bound to an episode (by a seed in a rollout context, or by a restore). */
  private readonly sessions = new Map<string, TrackedSession>();
  /** rollout → its tracked session ids: retire never scans every session. */
  private readonly byRollout = new Map<string, Set<string>>();
  private readonly inflightBySession = new Map<string, number>();
  /** Non-replayable requests in flight: what readiness waits for. */
  private inflight = 0;
  /** Seeds in flight per attempt (§4.3 step 4): retire waits for those of covered attempts. */
  private readonly seedsInFlight = new Map<CaptureKey, { episode: EpisodeId; n: number }>();
  /** Recorded retired and still tracked: blocks prepare, never exported. */
  private readonly retiring = new Set<string>();
  /** Every session a retire recorded, refused until `forget` of its rollout. */
  private readonly retiredIds = new Map<string, EpisodeId>();
  private readonly retiredByRollout = new Map<string, Set<string>>();
  /** Sessions whose replayable verify finished while a checkpoint was open: ended at resume. */
  private readonly pendingEnds = new Set<string>();
  /** A session was ever seeded live here: this process is no restore target any more. */
  private served = false;
  private readonly groupScored: GroupScoring | undefined;
  private waiters: Array<() => void> = [];

  readonly deferredRecordField: string | undefined;

  constructor(opts: ResourcesParticipantOptions) {
    this.mode = opts.mode;
    this.verify = opts.verify;
    this.stateHooks = opts.stateHooks;
    // The storage threads start on the first restore whose file is large enough to defer, not
    // here: starting them costs CPU a server whose states stay small never needs to spend.
    if (this.mode === 'exported' && this.stateHooks?.deferredStates) {
      this.deferredRecordField = 'state';
      deferMinBytes(); // a bad NG_RECORDS_DEFER_MIN_BYTES fails the start, not a restore
    }
    this.groupScored = opts.groupScored;
    this.log = opts.log ?? (() => undefined);
    if (this.mode === 'exported' && !this.stateHooks) {
      throw new Error("checkpoint_mode 'exported' needs the session hooks (export, restore, retire)");
    }
  }

  /** Called once the control plane exists (it owns the retire marks). */
  attach(marks: RetireMarkView): void {
    this.marks = marks;
  }

  // --- data plane (participants.md §4.3) -----------------------------------------------

  isReplayable(path: string): boolean {
    return path === VERIFY_PATH && this.verify === 'replay';
  }

  /** Steps 2–3: seeds always wait for "open"; other requests unless replayable or restart-only. */
  private waitsForAdmission(t: RequestTicket): boolean {
    if (t.path === SEED_PATH) return true;
    return !t.replayable && this.mode !== 'restart_only';
  }

  ticket(path: string, sessionId: string, episode: EpisodeId | undefined): RequestTicket {
    return { path, sessionId, episode, replayable: this.isReplayable(path), countedSession: false, countedGlobal: false, released: false };
  }

  /** Steps 2–6. Throws a refusal (the ticket must still be released). */
  async admit(t: RequestTicket, signal?: AbortSignal): Promise<void> {
    const gated = this.waitsForAdmission(t);
    if (gated) await this.gate.wait(signal);
    if (t.released) throw refuse('checkpoint_error', 'the request ended while it waited for admission');
    // Step 4, before anything else can await: retire must see this seed.
    if (t.path === SEED_PATH && t.episode) {
      const key = captureKey(t.episode);
      t.seedKey = key;
      const cur = this.seedsInFlight.get(key);
      if (cur) cur.n += 1;
      else this.seedsInFlight.set(key, { episode: t.episode, n: 1 });
    }
    // Step 5: `/close_session` is how state is released, so it is never refused.
    if (t.path !== CLOSE_PATH) {
      const s = this.sessions.get(t.sessionId);
      if (this.retiredIds.has(t.sessionId) || (s && this.isRetired(s.episode))) {
        throw refuse('stale_attempt', `session '${t.sessionId}' belongs to a retired attempt${s ? ` (${captureKey(s.episode)})` : ''}`);
      }
      if (t.episode && this.isRetired(t.episode)) {
        throw refuse('stale_attempt', `attempt ${captureKey(t.episode)} was retired`);
      }
      if (gated && !this.gate.isOpen) throw refuse('admission_closed', 'a checkpoint closed admission again; retry after resume');
      if (s?.restored) s.restored = false;
    }
    // Step 6.
    this.inflightBySession.set(t.sessionId, (this.inflightBySession.get(t.sessionId) ?? 0) + 1);
    t.countedSession = true;
    if (!t.replayable) {
      this.inflight += 1;
      t.countedGlobal = true;
    }
  }

  /** Headers of a successful seed reply (step 7). */
  seedHeaders(): Record<string, string> {
    const h: Record<string, string> = { 'x-ng-checkpoint-verify': this.verify };
    if (this.mode === 'restart_only') h['x-ng-checkpoint-restart'] = '1';
    return h;
  }

  /** Step 8, on the start of a 2xx reply. */
  completed(t: RequestTicket, closeFollows: boolean): void {
    if (!t.countedSession) return;
    if (t.path === SEED_PATH) {
      // A seed without a rollout prefix names no episode: not tracked (§8 q6).
      if (t.episode) this.bind(t.sessionId, t.episode);
    } else if (t.path === CLOSE_PATH) {
      this.end(t.sessionId);
    } else if (t.path === VERIFY_PATH) {
      if (closeFollows) return;
      // The open checkpoint still exports the session; a restore re-runs this verify.
      if (t.replayable && !this.gate.isOpen && this.sessions.has(t.sessionId)) this.pendingEnds.add(t.sessionId);
      else this.end(t.sessionId);
    }
  }

  /** Step 9: synchronous and idempotent, so a dropped connection cannot leak a count. */
  release(t: RequestTicket): void {
    if (t.released) return;
    t.released = true;
    if (t.countedSession) {
      const n = (this.inflightBySession.get(t.sessionId) ?? 1) - 1;
      if (n > 0) this.inflightBySession.set(t.sessionId, n);
      else this.inflightBySession.delete(t.sessionId);
    }
    if (t.countedGlobal) this.inflight -= 1;
    if (t.seedKey !== undefined) {
      const cur = this.seedsInFlight.get(t.seedKey);
      if (cur && --cur.n <= 0) this.seedsInFlight.delete(t.seedKey);
    }
    this.changed();
  }

  private isRetired(e: EpisodeId): boolean {
    return this.marks?.isRetired(e) ?? false;
  }

  private bind(sessionId: string, episode: EpisodeId): void {
    this.untrack(sessionId);
    this.sessions.set(sessionId, { episode, restored: false });
    addTo(this.byRollout, episode.rollout_id, sessionId);
    this.served = true;
    this.changed();
  }

  private end(sessionId: string): void {
    if (this.untrack(sessionId)) this.changed();
  }

  private untrack(sessionId: string): boolean {
    const s = this.sessions.get(sessionId);
    this.pendingEnds.delete(sessionId);
    this.retiring.delete(sessionId);
    if (!s) return false;
    this.sessions.delete(sessionId);
    removeFrom(this.byRollout, s.episode.rollout_id, sessionId);
    return true;
  }

  private changed(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const wake of w) wake();
    this.marks?.notify();
  }

  /** Resolves once `pred` holds; re-checked on every state change; rejects when `signal` aborts. */
  private waitUntil(pred: () => boolean, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const check = (): void => {
        if (signal.aborted) return reject(signal.reason);
        if (pred()) {
          signal.removeEventListener('abort', onAbort);
          return resolve();
        }
        this.waiters.push(check);
      };
      const onAbort = (): void => {
        this.waiters = this.waiters.filter((w) => w !== check);
        reject(signal.reason);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      check();
    });
  }

  // --- control-plane hooks -----------------------------------------------------------

  closeAdmission(): void {
    this.gate.close();
  }

  openAdmission(): void {
    for (const id of [...this.pendingEnds]) this.end(id);
    this.pendingEnds.clear();
    this.gate.reopen();
    this.changed();
  }

  /** §4.4: nothing in flight (ignored when restart-only) and no half-retired session left. */
  ready(): boolean {
    return (this.mode === 'restart_only' || this.inflight === 0) && this.retiring.size === 0;
  }

  report(): ReadinessReport {
    const blockers: CaptureKey[] = [];
    for (const id of this.retiring) {
      const s = this.sessions.get(id);
      if (s) blockers.push(captureKey(s.episode));
    }
    const restarts: CaptureKey[] = [];
    if (this.mode === 'restart_only') {
      for (const [id, s] of this.sessions) if (!this.retiring.has(id)) restarts.push(captureKey(s.episode));
    }
    return { blockers, counts: { inflight: this.inflight, sessions: this.sessions.size }, restarts };
  }

  async export(req: ExportRequest): Promise<ExportResult> {
    if (this.mode !== 'exported') return { records: [] };
    const inScope = req.scope ? new Set(req.scope.map(captureKey)) : undefined;
    const chosen: Array<[string, EpisodeId]> = [];
    for (const [id, s] of this.sessions) {
      const key = captureKey(s.episode);
      if (this.retiring.has(id) || this.retiredIds.has(id) || req.carriedRestarts.has(key)) continue;
      if (inScope && !inScope.has(key)) continue;
      chosen.push([id, s.episode]);
    }
    const states = await this.stateHooks!.exportSessionStates(chosen.map(([id]) => id));
    req.signal.throwIfAborted();
    const records: CheckpointRecord[] = [];
    for (const [id, episode] of chosen) {
      if (!states.has(id)) {
        this.log(`session '${id}' of ${captureKey(episode)} has no state to export; treating it as dropped`);
        this.end(id);
        continue;
      }
      records.push({ episode_id: episode, session_id: id, state: states.get(id) ?? null });
    }
    return { records };
  }

  validateRecord(record: CheckpointRecord): void {
    if (typeof record.session_id !== 'string' || record.session_id.length === 0) throw new Error('session_id must be a non-empty string');
    if (!('state' in record)) throw new Error('record has no state');
  }

  assertRestorable(): void {
    const live = [...this.sessions.values()].some((s) => !s.restored);
    if (this.served || live) throw refuse('checkpoint_error', 'this resources server already served sessions; restore needs a fresh process');
    if (this.inflight > 0 || this.inflightBySession.size > 0 || this.seedsInFlight.size > 0) {
      throw refuse('checkpoint_error', 'this resources server has requests in flight; restore needs a fresh process');
    }
  }

  async install(req: InstallRequest): Promise<CaptureKey[]> {
    this.assertRestorable();
    if (req.records.length === 0) return [];
    if (this.mode !== 'exported') {
      throw refuse('checkpoint_error', `a ${this.mode} resources server exports no session state; refusing ${req.records.length} record(s)`);
    }
    const states = new Map<string, unknown>();
    const deferred = this.stateHooks!.deferredStates === true;
    for (const r of req.records) {
      const id = r.session_id as string;
      if (states.has(id)) throw refuse('invalid_checkpoint_state', `session '${id}' appears in more than one record`);
      states.set(id, deferred ? r.state : materialized(r.state));
    }
    try {
      await this.stateHooks!.restoreSessionStates(states);
    } catch (err) {
      if (err instanceof ProtocolError) throw err;
      throw refuse('invalid_checkpoint_state', `restoring session states failed: ${(err as Error)?.message ?? String(err)}`);
    }
    const keys: CaptureKey[] = [];
    for (const r of req.records) {
      const id = r.session_id as string;
      const replacement = nextAttempt(r.episode_id);
      this.untrack(id);
      this.sessions.set(id, { episode: replacement, restored: true });
      addTo(this.byRollout, replacement.rollout_id, id);
      keys.push(captureKey(replacement));
    }
    this.changed();
    return keys;
  }

  /** Unclaimed restored sessions the commit scope leaves out: freed, no mark left behind. */
  async deleteRestored(scope: readonly EpisodeId[]): Promise<void> {
    const keep = new Set(scope.map(captureKey));
    const drop = [...this.sessions].filter(([, s]) => s.restored && !keep.has(captureKey(s.episode))).map(([id]) => id);
    for (const id of drop) {
      if (this.mode === 'exported') await this.stateHooks!.retireSessionState(id);
      this.end(id);
    }
  }

  /** §4.5: seeds first, then record, drain, free, untrack; cut short → still tracked and blocking. */
  async retire(targets: readonly EpisodeId[], signal: AbortSignal): Promise<void> {
    const covers = (e: EpisodeId): boolean => targets.some((t) => t.rollout_id === e.rollout_id && e.attempt <= t.attempt);
    const seedKeysCovered = (): boolean => {
      for (const { episode } of this.seedsInFlight.values()) if (covers(episode)) return true;
      return false;
    };
    await this.waitUntil(() => !seedKeysCovered(), signal);

    const ids: string[] = [];
    for (const t of targets) {
      for (const id of this.byRollout.get(t.rollout_id) ?? []) {
        const s = this.sessions.get(id)!;
        if (covers(s.episode)) ids.push(id);
      }
    }
    for (const id of ids) {
      const e = this.sessions.get(id)!.episode;
      this.retiring.add(id);
      this.retiredIds.set(id, e);
      addTo(this.retiredByRollout, e.rollout_id, id);
    }
    this.changed();

    await this.waitUntil(() => ids.every((id) => !this.inflightBySession.has(id)), signal);
    for (const id of ids) {
      signal.throwIfAborted();
      if (this.mode === 'exported') await this.stateHooks!.retireSessionState(id);
      this.end(id);
    }
  }

  assertForgettable(rolloutIds: readonly string[]): void {
    const left: string[] = [];
    for (const r of rolloutIds) {
      for (const id of this.retiredByRollout.get(r) ?? []) if (this.sessions.has(id)) left.push(id);
    }
    const wanted = new Set(rolloutIds);
    const seeds = [...this.seedsInFlight].filter(([, { episode }]) => wanted.has(episode.rollout_id) && this.isRetired(episode)).map(([k]) => k);
    if (left.length || seeds.length) {
      throw refuse(
        'retire_incomplete',
        `retired work is still live: ${[...left.map((id) => `session '${id}'`), ...seeds.map((k) => `seed of ${k}`)].join(', ')}; retire again, then forget`,
      );
    }
  }

  forget(rolloutIds: readonly string[]): void {
    for (const r of rolloutIds) {
      for (const id of this.retiredByRollout.get(r) ?? []) this.retiredIds.delete(id);
      this.retiredByRollout.delete(r);
    }
  }

  statusExtras(): Record<string, unknown> {
    return {
      mode: this.mode,
      verify: this.verify,
      retired_sessions: this.retiredIds.size,
      capabilities: {
        checkpoint_mode: this.mode,
        checkpoint_verify: this.verify,
        group_size: this.groupScored?.group_size ?? null,
        cohort_collection_timeout_s: this.groupScored?.cohort_collection_timeout_s ?? null,
      },
    };
  }
}

function addTo(index: Map<string, Set<string>>, key: string, id: string): void {
  let set = index.get(key);
  if (!set) index.set(key, (set = new Set()));
  set.add(id);
}

function removeFrom(index: Map<string, Set<string>>, key: string, id: string): void {
  const set = index.get(key);
  if (!set) return;
  set.delete(id);
  if (set.size === 0) index.delete(key);
}
