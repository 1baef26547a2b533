// The policy model as a checkpoint participant of kind `model` (participants.md §5): the admission
// gate in front of the backend, tickets of admitted calls, responses held while a checkpoint is
// open, the capture ledger and token store written at response start, export/install of ledger
// rows and generation cuts, and retire. It is the proxy's gate (gate.ts) and the control plane's
// hooks (servers/control/hooks.ts) at once.
//
// Readiness never waits for a generation: only a response that already started streaming blocks
// prepare (it must finish sending). An undelivered response is simply held. With generation cuts
// on, prepare asks the backend to stage the prefix of every undelivered call (§5.6) and waits for
// that round, which is bounded by half the remaining prepare time.
import { randomBytes } from 'node:crypto';
import { refuse } from '../../protocol/errors.js';
import { captureKey, nextAttempt, sortedKeys, type CaptureKey, type EpisodeId } from '../../protocol/ids.js';
import type { ControlPlane } from '../control/control-plane.js';
import type { CheckpointRecord } from '../../protocol/manifest.js';
import type { ExportRequest, ExportResult, InstallRequest, ParticipantHooks, ReadinessReport } from '../control/hooks.js';
import { CaptureLedger, type ImportEntry, type LedgerRow } from './capture-ledger.js';
import { postInventory } from './cut-client.js';
import { buildInventory, GenerationCutSchema, type CutOutcome, type GenerationCut } from './cut-wire.js';
import { constrainedDecoding, FINGERPRINT_VERSION, normalizeMessage, requestContext, turnFingerprint, type RequestContext } from './conversation.js';
import type { AdmittedCall, GenerationCall, GenerationGate, ReplyTokens, ResponseStart } from './gate.js';
import { responseIdOf, tokensOfCompletion, weightVersionOf } from './reply-tokens.js';
import { stagingKeyOf, writeStagedTokens, TOKEN_STORE_FORMAT } from './token-store.js';
import { untilAborted } from '../common/async.js';

export interface ModelParticipantOptions {
  /** This server's name (the inventory's `server_name`). */
  serverName: string;
  /** Root of the capture ledger and token store. */
  captureDir: string;
  /** Cut undelivered generations at prepare and continue restored cuts (§5.6). */
  generationCuts: boolean;
  /** `ng` (ours) or `openai` (a third-party server), reported by status for discovery. */
  backendApi?: 'ng' | 'openai';
  /** Backend root (no `/v1`), where the cut service lives. */
  backendRoot: string;
  /** Bearer token for the backend's cut service (the deployment's control token). */
  controlToken?: string;
  /** Cut request budget when the prepare deadline is unknown. */
  defaultCutTimeoutMs?: number;
  log?: (msg: string, err?: unknown) => void;
}

/** Concurrent rollouts whose files a sweep (after a restore) or a retire deletes. */
const SWEEP_CONCURRENCY = 16;

interface Ticket {
  id: string;
  key: CaptureKey | undefined;
  episode: EpisodeId | undefined;
  modelCallId: string;
  admittedAt: number;
  ctx: RequestContext | undefined;
  /** The request's messages (a text-only capture keeps them). */
  messages: unknown[] | undefined;
  parentCallId: string | null;
  cuttable: boolean;
  /** Aborted by retire; its reason is the refusal. */
  cancel: AbortController;
  /** Caller gone or cancelled. */
  signal: AbortSignal;
  started: boolean;
  held: boolean;
  ended: boolean;
  endedPromise: Promise<void>;
  resolveEnded: () => void;
  tokensWritten: boolean;
  /** Its ledger row (or tokens) could not be written: no answer goes out. */
  poisoned?: boolean;
  /** A durable cut of this call, from the cut round of `checkpointId`. */
  cut?: { checkpointId: string; cut: GenerationCut };
  /** The cut this call continues (sent as `ng_capture.generation_cut`). */
  continues?: GenerationCut;
  /** The restored cut entry this call settles when it delivers (the one it continues, or its own newer cut). */
  claimed?: RestoredCut;
}

interface RestoredCut {
  cut: GenerationCut;
  /** The ticket continuing it; it stays restored until that call delivers its response. */
  claimedBy?: string;
}

interface Waiter {
  /** A call waiting for admission, or an admitted call's response held until resume. */
  kind: 'admission' | 'held';
  /** Admission waiters name their episode (a retire refuses them); held responses are cancelled through their ticket. */
  episode: EpisodeId | undefined;
  resolve(): void;
  reject(err: unknown): void;
}

interface CutRound {
  checkpointId: string;
  done: boolean;
  abort: AbortController;
  counts: { cut: number; cut_failed: number; cut_skipped: number };
}

const hex = (bytes: number): string => randomBytes(bytes).toString('hex');

function staleAttempt(e: EpisodeId, why: string): Error {
  return refuse('stale_attempt', `attempt ${captureKey(e)} was retired${why}`);
}

export class ModelParticipant implements GenerationGate {
  readonly hooks: ParticipantHooks;
  private plane: ControlPlane | undefined;

  private open = true;
  private readonly waiters = new Set<Waiter>();
  private readonly tickets = new Map<string, Ticket>();
  /** Rollout → its live tickets (retire, export). */
  private readonly byRollout = new Map<string, Set<Ticket>>();
  private readonly streaming = new Set<Ticket>();
  private heldCount = 0;
  private served = false;

  /** Restored replacement attempts (N+1) → whether a call of them arrived yet. */
  private readonly restoredTargets = new Map<CaptureKey, { episode: EpisodeId; started: boolean }>();
  private readonly restoredCuts = new Map<CaptureKey, RestoredCut>();

  private cutRound: CutRound | undefined;
  /** Background sweep of retired attempts' files after a restore; retire and the next install wait for it. */
  private sweep: Promise<void> = Promise.resolve();
  /** Opens the last restore's background file work (held until resume). */
  private backgroundGate: (() => void) | undefined;
  private prepareDeadline: { checkpointId: string; deadlineTs: number } | undefined;
  private readonly log: (msg: string, err?: unknown) => void;

  private constructor(
    private readonly opts: ModelParticipantOptions,
    readonly ledger: CaptureLedger,
  ) {
    this.log = opts.log ?? (() => undefined);
    this.hooks = this.buildHooks();
  }

  static async create(opts: ModelParticipantOptions): Promise<ModelParticipant> {
    return new ModelParticipant(opts, await CaptureLedger.open(opts.captureDir));
  }

  /** The control plane mounted with these hooks (its marks decide `stale_attempt`). */
  attach(plane: ControlPlane): void {
    this.plane = plane;
  }

  get captureDir(): string {
    return this.opts.captureDir;
  }

  /** The prepare request's deadline, so the cut round can take half the remaining time. */
  notePrepare(checkpointId: string, deadlineTs: number): void {
    this.prepareDeadline = { checkpointId, deadlineTs };
  }

  private notify(): void {
    this.plane?.notify();
  }

  private isRetired(e: EpisodeId): boolean {
    return this.plane?.isRetired(e) ?? false;
  }

  // --- admission (§5.2 steps 2–3) ---------------------------------------------------------------

  async admit(call: GenerationCall): Promise<AdmittedCall> {
    const e = call.episode;
    for (;;) {
      if (e && this.isRetired(e)) throw staleAttempt(e, '');
      if (this.open) break;
      // Not admitted while waiting: not counted, no ticket.
      await this.waitOpen('admission', call.signal, e);
    }
    return this.enter(call);
  }

  private waitOpen(kind: Waiter['kind'], signal: AbortSignal, episode: EpisodeId | undefined): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => w.reject(signal.reason);
      const cleanup = (): void => {
        this.waiters.delete(w);
        signal.removeEventListener('abort', onAbort);
      };
      const w: Waiter = {
        kind,
        episode,
        resolve: () => {
          cleanup();
          resolve();
        },
        reject: (err) => {
          cleanup();
          reject(err);
        },
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.waiters.add(w);
    });
  }

  /** Enters a ticket; no await between the admission check and here. */
  private enter(call: GenerationCall): AdmittedCall {
    this.served = true;
    const cancel = new AbortController();
    let resolveEnded!: () => void;
    const endedPromise = new Promise<void>((r) => (resolveEnded = r));
    const key = call.key;
    const t: Ticket = {
      id: hex(16),
      key,
      episode: call.episode,
      modelCallId: `mc_${hex(12)}`,
      admittedAt: Date.now() / 1000,
      ctx: undefined,
      messages: undefined,
      parentCallId: null,
      cuttable: constrainedDecoding(call.body) === undefined,
      cancel,
      signal: AbortSignal.any([call.signal, cancel.signal]),
      started: false,
      held: false,
      ended: false,
      endedPromise,
      resolveEnded,
      tokensWritten: false,
    };
    let backendBody = call.body;
    if (key !== undefined && call.episode) {
      t.ctx = requestContext(call.body);
      t.messages = Array.isArray(call.body.messages) ? call.body.messages : undefined;
      t.parentCallId = this.ledger.parentOf(key, t.ctx);
      const target = this.restoredTargets.get(key);
      if (target) target.started = true;
      const restored = this.restoredCuts.get(key);
      if (this.opts.generationCuts && t.cuttable && restored && restored.claimedBy === undefined && restored.cut.request_digest === t.ctx.request_digest) {
        restored.claimedBy = t.id;
        t.claimed = restored;
        t.continues = restored.cut;
      }
      backendBody = {
        ...call.body,
        ng_capture: {
          rollout_id: call.episode.rollout_id,
          attempt: call.episode.attempt,
          capture_key: key,
          model_call_id: t.modelCallId,
          ticket_id: t.id,
          mode: 'text',
          parent_call_id: t.parentCallId,
          staging_key: stagingKeyOf(key, t.modelCallId),
          admitted_at: t.admittedAt,
          generation_cut: t.continues ? t.continues.continuation : null,
        },
      };
      let set = this.byRollout.get(call.episode.rollout_id);
      if (!set) this.byRollout.set(call.episode.rollout_id, (set = new Set()));
      set.add(t);
    }
    this.tickets.set(t.id, t);
    this.notify();
    return {
      backendBody,
      signal: cancel.signal,
      deliver: (start) => this.deliver(t, start),
      complete: (tokens) => this.complete(t, tokens),
      end: () => this.end(t),
    };
  }

  // --- response start, hold, ledger row (§5.2 step 4, §5.4) ------------------------------------

  private async deliver(t: Ticket, start: ResponseStart): Promise<void> {
    while (!this.open) {
      t.held = true;
      this.heldCount++;
      try {
        await this.waitOpen('held', t.signal, undefined);
      } finally {
        t.held = false;
        this.heldCount--;
      }
    }
    t.signal.throwIfAborted();
    // Its caller's connection closed while it was held: nothing to send, and nothing to wait for.
    if (t.ended) throw new Error(`model call ${t.id} ended before its reply was delivered`);
    // From here the response counts as started: a prepare waits for it to finish sending.
    t.started = true;
    this.streaming.add(t);
    this.notify();
    if (t.key === undefined || !t.ctx || start.status < 200 || start.status >= 300) return;
    try {
      if (!start.stream) {
        // A plain reply is complete at its start: stage its tokens before the row names them.
        await this.writeTokens(t, tokensOfCompletion(start.body));
      }
      await this.writeRow(t, start);
    } catch (err) {
      // Poisoned: no answer is sent, and nothing more of it is staged.
      t.poisoned = true;
      throw err;
    }
    if (t.claimed && t.claimed.claimedBy === t.id && this.restoredCuts.get(t.key) === t.claimed) {
      // The call that used the restored cut delivered: the cut has served its purpose.
      this.restoredCuts.delete(t.key);
    }
  }

  private async writeRow(t: Ticket, start: ResponseStart): Promise<void> {
    // Never after cancellation; once started, the write runs to its end.
    if (t.cancel.signal.aborted) throw t.cancel.signal.reason;
    const first = start.stream ? start.events?.[0] : start.body;
    const version = start.stream ? ((start.events ?? []).map(weightVersionOf).find((v) => v !== null) ?? null) : weightVersionOf(start.body);
    const ctx = t.ctx!;
    const row: LedgerRow = {
      model_call_id: t.modelCallId,
      parent_call_id: t.parentCallId,
      staging_key: stagingKeyOf(t.key!, t.modelCallId),
      weight_version: version,
      fingerprint: ctx.fingerprint,
      fingerprint_version: FINGERPRINT_VERSION,
      context_len: ctx.context_len,
      context_digest: ctx.context_digest,
      digest: ctx.request_digest,
      output_fingerprint: start.stream ? null : outputFingerprintOf(start.body),
      mode: 'text',
      logical_request_id: t.id,
      admitted_at: t.admittedAt,
      response_id: responseIdOf(first),
      ...(t.continues ? { generation_cut_source: t.continues.continuation.source_model_call_id } : {}),
    };
    await this.ledger.append(t.key!, row);
  }

  private async writeTokens(t: Ticket, tokens: ReplyTokens): Promise<void> {
    if (t.tokensWritten || t.key === undefined) return;
    if (t.cancel.signal.aborted) throw t.cancel.signal.reason;
    await writeStagedTokens(
      this.opts.captureDir,
      {
        format: TOKEN_STORE_FORMAT,
        staging_key: stagingKeyOf(t.key, t.modelCallId),
        capture_key: t.key,
        model_call_id: t.modelCallId,
        weight_version: tokens.weightVersion,
        prompt_token_ids: tokens.promptTokenIds,
        completion_token_ids: tokens.completionTokenIds,
        completion_logprobs: tokens.completionLogprobs,
        finish_reason: tokens.finishReason,
        complete: tokens.complete,
        capture: tokens.completionTokenIds !== null ? 'tokens' : 'text',
        completion_message: tokens.completionMessage ?? null,
        ...(tokens.promptTokenIds === null && t.messages ? { prompt_messages: t.messages } : {}),
      },
      { dirExists: this.ledger.hasTokens(t.key) },
    );
    this.ledger.noteTokens(t.key);
    t.tokensWritten = true;
  }

  private async complete(t: Ticket, tokens: ReplyTokens): Promise<void> {
    if (!t.started || !t.ctx || t.poisoned) return;
    await this.writeTokens(t, tokens);
  }

  private end(t: Ticket): void {
    if (t.ended) return;
    t.ended = true;
    this.tickets.delete(t.id);
    this.streaming.delete(t);
    if (t.episode) {
      const set = this.byRollout.get(t.episode.rollout_id);
      set?.delete(t);
      if (set && set.size === 0) this.byRollout.delete(t.episode.rollout_id);
    }
    // A continuation that did not deliver leaves the restored cut for the next call.
    if (t.claimed && t.claimed.claimedBy === t.id) t.claimed.claimedBy = undefined;
    t.resolveEnded();
    this.notify();
  }

  // --- generation cuts (§5.6) ---------------------------------------------------------------------

  private startCutRound(checkpointId: string): void {
    const undelivered = [...this.tickets.values()].filter((t) => t.key !== undefined && t.episode && !t.started && !t.ended);
    const cuttable = undelivered.filter((t) => t.cuttable);
    const round: CutRound = {
      checkpointId,
      done: false,
      abort: new AbortController(),
      counts: { cut: 0, cut_failed: 0, cut_skipped: undelivered.length - cuttable.length },
    };
    this.cutRound = round;
    if (cuttable.length === 0) {
      round.done = true;
      return;
    }
    const inventory = buildInventory(
      checkpointId,
      this.opts.serverName,
      cuttable.map((t) => ({
        ticket_id: t.id,
        rollout_id: t.episode!.rollout_id,
        attempt: t.episode!.attempt,
        model_call_id: t.modelCallId,
        admitted_at: t.admittedAt,
      })),
    );
    const deadline = this.prepareDeadline?.checkpointId === checkpointId ? this.prepareDeadline.deadlineTs : undefined;
    const timeoutMs = deadline !== undefined ? Math.max(1, (deadline * 1000 - Date.now()) / 2) : (this.opts.defaultCutTimeoutMs ?? 5_000);
    const byId = new Map(cuttable.map((t) => [t.id, t]));
    void postInventory({ backendRoot: this.opts.backendRoot, token: this.opts.controlToken, inventory, timeoutMs, signal: round.abort.signal })
      .then(
        (outcomes) => this.applyCuts(round, byId, outcomes),
        (err: unknown) => {
          // Any failure: every call of that backend is a durable failure (it regenerates later).
          if (!round.abort.signal.aborted) this.log(`generation cut of checkpoint '${checkpointId}' failed`, err);
          round.counts.cut_failed += cuttable.length;
        },
      )
      .finally(() => {
        round.done = true;
        this.notify();
      });
  }

  private applyCuts(round: CutRound, byId: Map<string, Ticket>, outcomes: CutOutcome[]): void {
    for (const o of outcomes) {
      const t = byId.get(o.ticket_id)!;
      if (o.disposition !== 'durable_prefix') {
        round.counts.cut_failed++;
        continue;
      }
      round.counts.cut++;
      const cut: GenerationCut = {
        model_call_id: t.modelCallId,
        request_digest: t.ctx!.request_digest,
        continuation: { source_capture_key: t.key!, source_model_call_id: t.modelCallId, ...o.continuation },
      };
      t.cut = { checkpointId: round.checkpointId, cut };
      // The newest cut replaces the restored one for its capture key (settled when this call delivers).
      const old = this.restoredCuts.get(t.key!);
      if (old) {
        if (old.claimedBy !== undefined && old.claimedBy !== t.id) continue;
        const replaced: RestoredCut = { cut, claimedBy: t.id };
        this.restoredCuts.set(t.key!, replaced);
        t.claimed = replaced;
      }
    }
  }

  // --- hooks ---------------------------------------------------------------------------------------

  private buildHooks(): ParticipantHooks {
    return {
      kind: 'model',
      closeAdmission: () => {
        this.open = false;
        this.cutRound?.abort.abort();
        this.cutRound = undefined;
        const plane = this.plane;
        // Restore closes admission too (in a fresh process, phase still idle): nothing to cut then.
        if (this.opts.generationCuts && plane && plane.currentPhase === 'preparing' && plane.activeCheckpointId) {
          this.startCutRound(plane.activeCheckpointId);
        }
      },
      openAdmission: () => {
        this.open = true;
        this.releaseBackground();
        this.cutRound?.abort.abort();
        this.cutRound = undefined;
        for (const w of [...this.waiters]) w.resolve();
        this.notify();
      },
      ready: (carried) => this.isReady(carried),
      report: (carried) => this.report(carried),
      export: (req) => this.export(req),
      deleteRestored: (scope) => this.deleteRestored(scope),
      assertRestorable: () => {
        if (this.served) throw refuse('checkpoint_error', 'this policy model server has served model calls; restore needs a fresh process');
      },
      validateRecord: (r) => validateModelRecord(r),
      install: (req) => this.install(req),
      retire: (episodes, signal) => this.retire(episodes, signal),
      forget: (rolloutIds) => this.forgetRestored(rolloutIds),
      statusExtras: () => ({
        restored_generation_cuts: sortedKeys(this.restoredCuts.keys()),
        restored_pending: sortedKeys([...this.restoredTargets].filter(([, v]) => !v.started).map(([k]) => k)),
        // Calls waiting for admission (not admitted, so not in `inflight`).
        waiting_calls: this.waiting,
        // What discovery learns of the backend: without cuts, an undelivered call regenerates after a restore.
        backend: { api: this.opts.backendApi ?? 'ng', generation_cuts: this.opts.generationCuts },
      }),
    };
  }

  private isReady(carried: ReadonlySet<CaptureKey>): boolean {
    if (this.cutRound && !this.cutRound.done) return false;
    for (const t of this.streaming) if (t.key === undefined || !carried.has(t.key)) return false;
    return true;
  }

  private report(carried: ReadonlySet<CaptureKey>): ReadinessReport {
    const blockers: string[] = [];
    for (const t of this.streaming) {
      if (t.key === undefined) blockers.push(`model-call-without-episode:${t.id}`);
      else if (!carried.has(t.key)) blockers.push(t.key);
    }
    const round = this.cutRound;
    if (round && !round.done) blockers.push(`model-generation-cut:${round.checkpointId}`);
    return {
      blockers: [...new Set(blockers)],
      counts: {
        inflight: this.tickets.size,
        held: this.heldCount,
        cut: round?.counts.cut ?? 0,
        cut_failed: round?.counts.cut_failed ?? 0,
        cut_skipped: round?.counts.cut_skipped ?? 0,
      },
      restarts: [],
    };
  }

  // --- export (§5.3) -----------------------------------------------------------------------------

  private async export(req: ExportRequest): Promise<ExportResult> {
    if (req.scope === null) throw refuse('checkpoint_error', 'the policy model participant needs an explicit commit scope (episode_ids)');
    // Calls without a started response (this process is the only one sharing the ledger).
    const undelivered = new Set<string>();
    for (const t of this.tickets.values()) if (!t.started) undelivered.add(t.modelCallId);
    const records: CheckpointRecord[] = [];
    const all = new Set<string>();
    const byEpisode: Record<string, string[]> = {};
    const seen = new Set<CaptureKey>();
    for (const e of req.scope) {
      const key = captureKey(e);
      if (seen.has(key) || req.carriedRestarts.has(key)) continue;
      seen.add(key);
      req.signal.throwIfAborted();
      const rows = this.ledger.rows(key).filter((r) => !undelivered.has(r.model_call_id));
      const cut = this.cutOf(key, e.rollout_id, req.checkpointId);
      if (rows.length === 0 && !cut) continue;
      records.push({ episode_id: { rollout_id: e.rollout_id, attempt: e.attempt }, rows, generation_cuts: cut ? [cut] : [] });
      const keys = new Set<string>();
      for (const r of rows) if (typeof r.staging_key === 'string') keys.add(r.staging_key);
      for (const k of cut?.continuation.staging_keys ?? []) keys.add(k);
      if (keys.size) {
        byEpisode[key] = [...keys].sort();
        for (const k of keys) all.add(k);
      }
    }
    return { records, replyExtras: { staging_keys: [...all].sort(), staging_keys_by_episode: byEpisode } };
  }

  /** The latest undelivered call's cut from this checkpoint's round, else the restored cut. */
  private cutOf(key: CaptureKey, rolloutId: string, checkpointId: string): GenerationCut | undefined {
    let latest: Ticket | undefined;
    for (const t of this.byRollout.get(rolloutId) ?? []) {
      if (t.key !== key || t.started) continue;
      if (!latest || t.admittedAt > latest.admittedAt) latest = t;
    }
    if (latest?.cut && latest.cut.checkpointId === checkpointId) return latest.cut.cut;
    return this.restoredCuts.get(key)?.cut;
  }

  private async deleteRestored(scope: readonly EpisodeId[]): Promise<void> {
    this.releaseBackground();
    const keep = new Set(scope.map(captureKey));
    for (const [key, target] of [...this.restoredTargets]) {
      if (target.started || keep.has(key)) continue;
      this.restoredTargets.delete(key);
      this.restoredCuts.delete(key);
      // Without a fence: the controller may still start the rollout over as this attempt.
      await this.ledger.deleteLedger(key);
    }
  }

  /**
   * A rollout finished for good: a restored attempt that never called again (it was past its last
   * model call, e.g. waiting in a group-scored /verify) holds nothing any more. Its captured rows
   * stay: they are training data, not per-attempt bookkeeping.
   */
  private forgetRestored(rolloutIds: readonly string[]): void {
    const ids = new Set(rolloutIds);
    for (const [key, target] of [...this.restoredTargets]) {
      if (!ids.has(target.episode.rollout_id)) continue;
      this.restoredTargets.delete(key);
      this.restoredCuts.delete(key);
    }
    this.notify();
  }

  // --- install (§5.3) ----------------------------------------------------------------------------

  private async install(req: InstallRequest): Promise<CaptureKey[]> {
    this.releaseBackground();
    await this.sweep;
    const records = new Map<CaptureKey, CheckpointRecord>();
    for (const r of req.records) records.set(captureKey(r.episode_id), r);
    const scope = new Map<CaptureKey, EpisodeId>();
    for (const e of req.scope) scope.set(captureKey(e), e);
    const installed: CaptureKey[] = [];
    const entries: ImportEntry[] = [];
    for (const [key, e] of scope) {
      const target = nextAttempt(e);
      const targetKey = captureKey(target);
      this.restoredTargets.set(targetKey, { episode: target, started: false });
      this.restoredCuts.delete(targetKey);
      const rec = records.get(key);
      // Stamp each row with the capture key it was staged under (a restored row keeps it).
      const rows = rec
        ? ((rec.rows as LedgerRow[] | undefined) ?? []).map((r) => (typeof r.capture_key === 'string' ? r : { ...r, capture_key: key }))
        : undefined;
      entries.push({ rolloutId: e.rollout_id, targetKey, rows, retireUpTo: e.attempt });
      if (rec) {
        const cut = (rec.generation_cuts as GenerationCut[] | undefined)?.[0];
        if (cut) this.restoredCuts.set(targetKey, { cut });
        installed.push(targetKey);
      }
    }
    // Deletes what dead executions left for the targets and later attempts, imports the rows under
    // the targets, retires the ledgers of the checkpointed attempts and earlier ones. The ledger
    // files of the targets, and the files of the retired attempts (ledgers; staged tokens no
    // imported row names), are written and deleted once the restore resumes, not beside it: every
    // other participant of the deployment is restoring on the same cores until then, the journal
    // already holds the rows, and nothing appends before resume (admission is closed).
    const gate = new Promise<void>((open) => (this.backgroundGate = open));
    const { retired, materialized } = await this.ledger.importEpisodes(entries, gate);
    this.startBackground(gate, materialized, retired);
    return installed;
  }

  /** Lets the last restore's file work start: at resume, or once anything needs it done. */
  private releaseBackground(): void {
    this.backgroundGate?.();
    this.backgroundGate = undefined;
  }

  private startBackground(gate: Promise<void>, materialized: Promise<void>, retired: CaptureKey[]): void {
    const prev = this.sweep;
    this.sweep = Promise.all([
      materialized.catch((err: unknown) => this.log('writing imported capture ledgers failed', err)),
      Promise.all([prev, gate]).then(() => forEachLimit(retired, SWEEP_CONCURRENCY, (k) => this.ledger.sweepRetired(k))),
    ])
      .then(() => undefined)
      .catch((err: unknown) => this.log('sweeping files of retired attempts failed', err));
  }

  /**
   * Resolves once the background work of the last restore (ledger files written, retired files
   * swept) is done; starts it if the restore has not resumed yet.
   */
  async settled(): Promise<void> {
    this.releaseBackground();
    await this.sweep;
  }

  // --- retire (§5.2) -------------------------------------------------------------------------------

  private async retire(targets: readonly EpisodeId[], signal: AbortSignal): Promise<void> {
    const marks = new Map<string, number>();
    for (const t of targets) marks.set(t.rollout_id, Math.max(marks.get(t.rollout_id) ?? -1, t.attempt));
    const covered = (e: EpisodeId | undefined): boolean => e !== undefined && e.attempt <= (marks.get(e.rollout_id) ?? -1);
    // Waiting calls leave with stale_attempt, flagged here (not re-read from a mark a forget may drop).
    for (const w of [...this.waiters]) if (w.kind === 'admission' && covered(w.episode)) w.reject(staleAttempt(w.episode!, ' while it waited for admission'));
    const stopping: Promise<void>[] = [];
    for (const rollout of marks.keys()) {
      for (const tk of this.byRollout.get(rollout) ?? []) {
        if (!covered(tk.episode)) continue;
        if (!tk.cancel.signal.aborted) tk.cancel.abort(staleAttempt(tk.episode!, ''));
        stopping.push(tk.endedPromise);
      }
    }
    if (stopping.length) await untilAborted(Promise.all(stopping), signal);
    for (const [key, target] of [...this.restoredTargets]) {
      if (covered(target.episode)) {
        this.restoredTargets.delete(key);
        this.restoredCuts.delete(key);
      }
    }
    // A restore's background file work first: it may still be writing or deleting these ledgers.
    this.releaseBackground();
    await untilAborted(this.sweep, signal);
    await forEachLimit([...marks], SWEEP_CONCURRENCY, ([rollout, attempt]) => this.ledger.deleteAttempts(rollout, 0, attempt));
    this.notify();
  }

  // --- introspection (tests, status routes) ----------------------------------------------------------

  get inflight(): number {
    return this.tickets.size;
  }

  get held(): number {
    return this.heldCount;
  }

  /** Calls waiting for admission. */
  get waiting(): number {
    let n = 0;
    for (const w of this.waiters) if (w.kind === 'admission') n++;
    return n;
  }

  get admissionOpen(): boolean {
    return this.open;
  }
}

function outputFingerprintOf(body: unknown): string | null {
  const choice = (body as { choices?: Array<{ message?: unknown }> } | undefined)?.choices?.[0];
  return choice?.message ? turnFingerprint(normalizeMessage(choice.message)) : null;
}

/** Record shape check before install (a throw names the problem; the plane names the episode). */
export function validateModelRecord(r: CheckpointRecord): void {
  const rows = r.rows;
  if (!Array.isArray(rows)) throw new Error('model record has no rows array');
  for (const [i, row] of rows.entries()) {
    if (typeof row !== 'object' || row === null || Array.isArray(row)) throw new Error(`rows[${i}] is not an object`);
    const id = (row as Record<string, unknown>).model_call_id;
    if (typeof id !== 'string' || id.length === 0) throw new Error(`rows[${i}] has no model_call_id`);
  }
  const cuts = r.generation_cuts ?? [];
  if (!Array.isArray(cuts) || cuts.length > 1) throw new Error('generation_cuts must be an array of at most one cut');
  for (const c of cuts) {
    const p = GenerationCutSchema.safeParse(c);
    if (!p.success) throw new Error(`generation_cuts[0]: ${p.error.issues[0]?.path.join('.')} ${p.error.issues[0]?.message}`);
  }
}

async function forEachLimit<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}
