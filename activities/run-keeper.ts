// The worker's keeper of its `/run` activities. Each `/run` is completed asynchronously (by task
// token): the SDK hands the activity over at once and holds no slot or heartbeat timer for it; the
// keeper runs the HTTP call, heartbeats the activity itself and sends its outcome (result, failure
// or cancellation) through a bounded window of calls to the Temporal server. Why:
// - Heartbeats. Every heartbeat that reaches the server is a write of the rollout's state; with
//   thousands of parked `/run`s they were most of the dev server's work (docs/performance.md,
//   "Heartbeat load"). The keeper beats each held `/run` once per ~0.6 of its heartbeat timeout,
//   spread by jitter, and knows when each beat went out, so it never guesses a deadline (the SDK's
//   throttle hides when its last beat was sent).
// - Completions. Thousands of `/run`s returning in the same second (every parked episode released
//   after a checkpoint) each sent its completion at once; on a busy server they passed their
//   deadlines, the SDK does not send one twice, and each such activity waited out its heartbeat
//   timeout and ran again. Here they queue, at most `window` calls are in flight, and a queued
//   outcome is beaten on the same schedule until it is through.
// An outcome that never gets through loses nothing: the activity times out, its retry POSTs `/run`
// again and receives the kept reply (our `/run` is idempotent per attempt). But a completed report
// already went to its shard (`beforeComplete`), and a Gym that crashed since has no reply to keep:
// the retry would end the attempt as failed while its shard holds it sealed (chaos seed 563, a dev
// server restart then a Gym crash). So that result stays here until its completion gets through;
// the retry, when it comes to this worker, takes it (`takeKept`) instead of calling Gym again.
import { CompleteAsyncError, type Context } from '@temporalio/activity';
import { ActivityCancelledError, ActivityNotFoundError, ActivityPausedError, ActivityResetError, type Client } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import { RUN_BEAT_SHARE } from '../protocol/controller.js';

/** Calls to the server in flight at most: enough for hundreds a second at a healthy server's latency. */
export const DEFAULT_CALL_WINDOW = 32;
/** A `/run` is beaten once `RUN_BEAT_SHARE` of its heartbeat timeout, plus up to this share, passed since its last beat went out. */
const BEAT_JITTER = 0.2;
/** A due beat this close to its deadline (share of the timeout) goes out before any queued outcome. */
const URGENT_WITHIN = 0.3;
/** Backoff of a call that failed (not "not found"), doubling up to the max. */
const RETRY_DELAY_MS = 250;
const MAX_RETRY_DELAY_MS = 10_000;
/** How often held `/run`s are checked for a beat that is due. */
const SCAN_MS = 1_000;
/** How long a result whose completion the server refused stays for its activity's retry. */
export const KEPT_RESULT_MS = 30 * 60_000;

type Outcome = { kind: 'complete'; result: unknown } | { kind: 'fail'; error: unknown } | { kind: 'cancelled' };

interface Held {
  token: Uint8Array;
  timeoutMs: number;
  /** When the last beat that the server took went out (or when the activity started). */
  beatBase: number;
  /** When the next beat is due. */
  beatDue: number;
  abort: AbortController;
  /** Set once the `/run` ended: what the server is to be told. */
  outcome?: Outcome;
  /** The server asked for cancellation (a beat's answer): the outcome becomes a cancellation. */
  cancelRequested: boolean;
  /** A call for this activity is in flight (one at a time). */
  busy: boolean;
  /** Queued for its outcome, or its beat; not before `notBefore` (a failed call's backoff). */
  queued: boolean;
  beatQueued: boolean;
  notBefore: number;
  retryDelayMs: number;
  details: unknown;
  /** Runs before the completion is sent (once it succeeds, not again): its value is the result sent. */
  beforeComplete: ((client: Client, result: unknown) => Promise<unknown>) | undefined;
  /** The key the result is kept under once `beforeComplete` ran, until its completion gets through. */
  keepAs: string | undefined;
}

export interface AdoptOptions {
  /** Runs just before a result is sent (rollouts.ts: the report's signal to its shard); gives the result sent. */
  beforeComplete?: (client: Client, result: unknown) => Promise<unknown>;
  /** Keeps the result sent under this key until the server took it (see `takeKept`). */
  keepAs?: string;
}

export interface RunKeeperOptions {
  window?: number;
  scanMs?: number;
  log?: (message: string, fields: Record<string, unknown>) => void;
}

export interface RunKeeperStats {
  /** `/run`s whose HTTP call is still open. */
  running: number;
  /** Outcomes waiting to be sent (or to be sent again). */
  queued: number;
  inFlight: number;
  completed: number;
  failed: number;
  cancelled: number;
  beats: number;
  /** Activities the server no longer had (they timed out or ended): their retry gets the kept reply. */
  notFound: number;
  retried: number;
  /** Results kept for a retry (`takeKept`), and how many retries took one. */
  kept: number;
  takenKept: number;
}

export class RunKeeper {
  private readonly window: number;
  private readonly scanMs: number;
  private readonly log: NonNullable<RunKeeperOptions['log']>;
  private readonly held = new Set<Held>();
  /** Outcomes in the order the `/run`s ended. */
  private readonly outcomes: Held[] = [];
  /** Due beats, oldest due first. */
  private readonly beats: Held[] = [];
  private client: Client | undefined;
  private inFlight = 0;
  private running = 0;
  private scan: NodeJS.Timeout | undefined;
  private closing = false;
  private idle: Array<() => void> = [];
  /** Results whose `beforeComplete` ran, by `keepAs`, with when the server last refused them (0: not yet). */
  private readonly kept = new Map<string, { result: unknown; refusedAt: number }>();
  private readonly counts = { completed: 0, failed: 0, cancelled: 0, beats: 0, notFound: 0, retried: 0, takenKept: 0 };

  constructor(opts: RunKeeperOptions = {}) {
    this.window = opts.window ?? DEFAULT_CALL_WINDOW;
    this.scanMs = opts.scanMs ?? SCAN_MS;
    if (!Number.isInteger(this.window) || this.window < 1) throw new RangeError(`run keeper: window must be a positive integer, got ${this.window}`);
    this.log = opts.log ?? ((message, fields) => console.warn(`[run-keeper] ${message}`, JSON.stringify(fields)));
  }

  /**
   * Takes over the activity of `ctx`: runs `work` (its abort signal fires on the server's
   * cancellation or the worker's shutdown) and reports its outcome (`opts`: what runs before a
   * result is sent, and the key it is kept under). Returns the error the activity throws so that
   * the SDK completes nothing itself; `undefined` when the context has no client or no heartbeat
   * timeout (a mock environment, a local activity): the caller runs the work itself.
   */
  adopt(ctx: Context, details: unknown, work: (signal: AbortSignal) => Promise<unknown>, opts: AdoptOptions = {}): CompleteAsyncError | undefined {
    let client: Client;
    try {
      client = ctx.client;
    } catch {
      return undefined;
    }
    const timeoutMs = ctx.info.heartbeatTimeoutMs;
    if (ctx.info.isLocal || !timeoutMs || this.closing) return undefined;
    this.client ??= client;
    const now = Date.now();
    const h: Held = {
      token: ctx.info.taskToken,
      timeoutMs,
      // The server's heartbeat clock started when it handed out the task, a moment before now.
      beatBase: now - Math.min(1_000, timeoutMs / 10),
      beatDue: 0,
      abort: new AbortController(),
      cancelRequested: false,
      busy: false,
      queued: false,
      beatQueued: false,
      notBefore: 0,
      retryDelayMs: RETRY_DELAY_MS,
      details,
      beforeComplete: opts.beforeComplete,
      keepAs: opts.keepAs,
    };
    h.beatDue = nextBeat(h);
    this.held.add(h);
    this.running++;
    this.scan ??= setInterval(() => this.findDueBeats(), this.scanMs).unref();
    work(h.abort.signal).then(
      (result) => this.ended(h, { kind: 'complete', result }),
      (error: unknown) => this.ended(h, h.abort.signal.aborted && h.cancelRequested ? { kind: 'cancelled' } : { kind: 'fail', error }),
    );
    return new CompleteAsyncError();
  }

  stats(): RunKeeperStats {
    return { running: this.running, queued: this.outcomes.length, inFlight: this.inFlight, kept: this.kept.size, ...this.counts };
  }

  /**
   * The result sent for `key` by an earlier try of the same activity whose completion has not got
   * through (or was refused: the server timed that try out), taken once: the retry completes with
   * it instead of running the work again.
   */
  takeKept(key: string): unknown {
    this.forgetExpired();
    const k = this.kept.get(key);
    if (!k) return undefined;
    this.kept.delete(key);
    this.counts.takenKept++;
    this.log('a retried activity completes with the result its earlier try sent', { key, refused: k.refusedAt !== 0 });
    return k.result;
  }

  private forgetExpired(): void {
    const before = Date.now() - KEPT_RESULT_MS;
    for (const [key, k] of this.kept) if (k.refusedAt !== 0 && k.refusedAt < before) this.kept.delete(key);
  }

  /**
   * The worker stops: every `/run` still open is ended and failed as retryable (so it runs again on
   * another worker, where it attaches to its episode), and what is queued goes out for up to
   * `timeoutMs`. What does not, the server times out and retries.
   */
  async shutdown(timeoutMs: number): Promise<void> {
    this.closing = true;
    for (const h of this.held) if (!h.outcome) h.abort.abort(new Error('the worker is shutting down'));
    if (this.held.size === 0) return this.stopScan();
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      this.idle.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    this.stopScan();
  }

  private ended(h: Held, outcome: Outcome): void {
    this.running--;
    if (!this.held.has(h)) return; // the server no longer had it
    h.outcome =
      this.closing && outcome.kind !== 'complete'
        ? { kind: 'fail', error: ApplicationFailure.retryable('the worker shut down during /run', 'gym_transient') }
        : outcome;
    h.queued = true;
    this.outcomes.push(h);
    this.pump();
  }

  private findDueBeats(): void {
    const now = Date.now();
    const due: Held[] = [];
    for (const h of this.held) if (!h.beatQueued && !h.busy && now >= h.beatDue) due.push(h);
    due.sort((a, b) => a.beatDue - b.beatDue);
    for (const h of due) {
      h.beatQueued = true;
      this.beats.push(h);
    }
    this.pump();
  }

  /** Fills the window: beats close to their deadline first, then outcomes in order, then other due beats. */
  private pump(): void {
    const now = Date.now();
    while (this.inFlight < this.window) {
      const next = this.takeUrgentBeat(now) ?? this.takeOutcome(now) ?? this.takeBeat();
      if (!next) break;
      // An activity whose outcome is ready is told its outcome instead of being beaten.
      this.send(next, next.outcome ? 'outcome' : 'beat');
    }
    if (this.held.size === 0 && this.inFlight === 0) {
      this.stopScan();
      for (const resolve of this.idle.splice(0)) resolve();
    }
  }

  private takeUrgentBeat(now: number): Held | undefined {
    const h = this.beats[0];
    if (!h || h.beatBase + h.timeoutMs - now > h.timeoutMs * URGENT_WITHIN) return undefined;
    return this.takeBeat();
  }

  private takeBeat(): Held | undefined {
    for (;;) {
      const h = this.beats.shift();
      if (!h) return undefined;
      h.beatQueued = false;
      if (this.held.has(h) && !h.busy) {
        if (h.outcome) this.dequeueOutcome(h);
        return h;
      }
    }
  }

  private takeOutcome(now: number): Held | undefined {
    const i = this.outcomes.findIndex((h) => !h.busy && h.notBefore <= now);
    if (i < 0) return undefined;
    const [h] = this.outcomes.splice(i, 1);
    h!.queued = false;
    return h;
  }

  private dequeueOutcome(h: Held): void {
    if (!h.queued) return;
    const i = this.outcomes.indexOf(h);
    if (i >= 0) this.outcomes.splice(i, 1);
    h.queued = false;
  }

  private send(h: Held, what: 'beat' | 'outcome'): void {
    const client = this.client!;
    const sentAt = Date.now();
    h.busy = true;
    this.inFlight++;
    const call = what === 'beat' ? client.activity.heartbeat(h.token, h.details) : this.tell(client, h);
    call
      .then(
        () => {
          if (what === 'beat') {
            this.counts.beats++;
            this.beaten(h, sentAt);
          } else {
            this.held.delete(h);
            if (h.keepAs !== undefined) this.kept.delete(h.keepAs);
            this.counts[h.outcome!.kind === 'complete' ? 'completed' : h.outcome!.kind === 'fail' ? 'failed' : 'cancelled']++;
          }
        },
        (err: unknown) => this.callFailed(h, what, sentAt, err),
      )
      .finally(() => {
        h.busy = false;
        this.inFlight--;
        this.pump();
      });
  }

  private async tell(client: Client, h: Held): Promise<void> {
    const outcome = h.outcome!;
    const token = h.token;
    switch (outcome.kind) {
      case 'complete':
        if (h.beforeComplete) {
          // Within the window like the completion itself; a retry of a failed completion does not repeat it.
          outcome.result = await h.beforeComplete(client, outcome.result);
          h.beforeComplete = undefined;
          if (h.keepAs !== undefined) {
            this.forgetExpired();
            this.kept.set(h.keepAs, { result: outcome.result, refusedAt: 0 });
          }
        }
        return client.activity.complete(token, outcome.result);
      case 'fail':
        return client.activity.fail(token, outcome.error);
      case 'cancelled':
        return client.activity.reportCancellation(token);
    }
  }

  private beaten(h: Held, sentAt: number): void {
    h.beatBase = sentAt;
    h.beatDue = nextBeat(h);
  }

  private callFailed(h: Held, what: 'beat' | 'outcome', sentAt: number, err: unknown): void {
    if (err instanceof ActivityNotFoundError) {
      // The server no longer waits for this activity (it timed out, or an earlier call got
      // through): its retry, if any, attaches to the episode or receives the kept reply.
      this.counts.notFound++;
      this.held.delete(h);
      // Its result, if it went to its shard, waits for the retry from now on (KEPT_RESULT_MS).
      const k = h.keepAs === undefined ? undefined : this.kept.get(h.keepAs);
      if (k) k.refusedAt = Date.now();
      this.dequeueOutcome(h);
      h.abort.abort(err);
      return;
    }
    if (what === 'beat') {
      if (err instanceof ActivityCancelledError || err instanceof ActivityPausedError || err instanceof ActivityResetError) {
        // The beat reached the server: its clock restarted. Cancellation ends the `/run` and is
        // reported as such; pause and reset end it too and fail it (the server retries it later).
        this.beaten(h, sentAt);
        h.cancelRequested = err instanceof ActivityCancelledError;
        if (!h.outcome) h.abort.abort(err);
        return;
      }
      // A transient error: the next scan beats it again.
      h.beatDue = Date.now() + this.scanMs;
      return;
    }
    this.counts.retried++;
    const delay = h.retryDelayMs;
    h.retryDelayMs = Math.min(MAX_RETRY_DELAY_MS, h.retryDelayMs * 2);
    h.notBefore = Date.now() + delay;
    if (this.counts.retried % 100 === 1)
      this.log('a /run outcome call failed; sending it again', { error: String(err).slice(0, 300), delayMs: delay, ...this.stats() });
    h.queued = true;
    this.outcomes.unshift(h);
    setTimeout(() => this.pump(), delay).unref();
  }

  private stopScan(): void {
    if (this.scan) clearInterval(this.scan);
    this.scan = undefined;
  }
}

/** When `h` is beaten next: `RUN_BEAT_SHARE` of its timeout after the last beat, plus a random part (spread). */
function nextBeat(h: Held): number {
  return h.beatBase + h.timeoutMs * (RUN_BEAT_SHARE + Math.random() * BEAT_JITTER);
}
