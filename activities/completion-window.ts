// The completions of `/run` activities, sent by us instead of the SDK, at most `limit` calls in
// flight to the Temporal server. Why: when thousands of `/run`s return at once (every parked
// episode released after a checkpoint) the SDK sends every completion at once over the worker's
// connection; a busy server lets them pass their deadline, the SDK does not send them again, each
// such activity then waits out its heartbeat timeout and runs once more, and the worker's polls wait
// behind the pile meanwhile (docs/performance.md, "Controller at scale": 16,000 released at once).
// A bounded window turns the burst into a queue that drains at the server's pace. A completion
// that never gets through loses nothing: the activity times out, its retry POSTs `/run` again and
// receives the kept reply (our `/run` is idempotent per attempt).
import { CompleteAsyncError, type Context } from '@temporalio/activity';
import { ActivityCancelledError, ActivityNotFoundError, type Client } from '@temporalio/client';

/** Completion calls in flight at most: enough for hundreds a second at a healthy server's latency. */
export const DEFAULT_COMPLETION_WINDOW = 32;
/** Backoff of a completion call that failed (not "not found"), doubling up to the max. */
const RETRY_DELAY_MS = 250;
const MAX_RETRY_DELAY_MS = 10_000;
/** How often the queued completions are checked for a heartbeat that is due. */
const BEAT_SCAN_MS = 1_000;

interface Pending {
  token: Uint8Array;
  result: unknown;
  /** Send a heartbeat when it has waited this long since the last one (half its heartbeat timeout). */
  beatAfterMs: number;
  lastBeatAt: number;
  retryDelayMs: number;
  beatDue: boolean;
}

export interface CompletionWindowOptions {
  limit?: number;
  /** How often queued completions are checked for a due heartbeat (default 1 s). */
  beatScanMs?: number;
  log?: (message: string, fields: Record<string, unknown>) => void;
}

export interface CompletionWindowStats {
  queued: number;
  inFlight: number;
  completed: number;
  /** Completions the server no longer wanted (the activity had timed out or ended): their retry gets the kept reply. */
  notFound: number;
  retried: number;
}

export class CompletionWindow {
  private readonly limit: number;
  private readonly beatScanMs: number;
  private readonly log: NonNullable<CompletionWindowOptions['log']>;
  /** Completions waiting for a slot, oldest first. */
  private readonly queue: Pending[] = [];
  /** Every completion not yet sent through: queued, in flight or waiting to retry (their heartbeats). */
  private readonly pending = new Set<Pending>();
  private readonly beats: Pending[] = [];
  private client: Client | undefined;
  private inFlight = 0;
  private scan: NodeJS.Timeout | undefined;
  private idle: Array<() => void> = [];
  private readonly counts = { completed: 0, notFound: 0, retried: 0 };

  constructor(opts: CompletionWindowOptions = {}) {
    this.limit = opts.limit ?? DEFAULT_COMPLETION_WINDOW;
    this.beatScanMs = opts.beatScanMs ?? BEAT_SCAN_MS;
    if (!Number.isInteger(this.limit) || this.limit < 1) throw new RangeError(`completion window: limit must be a positive integer, got ${this.limit}`);
    this.log = opts.log ?? ((message, fields) => console.warn(`[completion-window] ${message}`, JSON.stringify(fields)));
  }

  /**
   * Takes over the completion of the activity of `ctx` with `result` and returns the error the
   * activity throws so that the SDK completes nothing itself; `undefined` when the context has no
   * client (a mock activity environment): the activity then returns `result` as usual.
   */
  handOver(ctx: Context, result: unknown): CompleteAsyncError | undefined {
    let client: Client;
    try {
      client = ctx.client;
    } catch {
      return undefined;
    }
    this.client ??= client;
    const timeout = ctx.info.heartbeatTimeoutMs;
    const entry: Pending = {
      token: ctx.info.taskToken,
      result,
      beatAfterMs: timeout ? timeout / 2 : Number.POSITIVE_INFINITY,
      lastBeatAt: Date.now(),
      retryDelayMs: RETRY_DELAY_MS,
      beatDue: false,
    };
    this.pending.add(entry);
    this.queue.push(entry);
    this.scan ??= setInterval(() => this.findDueBeats(), this.beatScanMs).unref();
    this.pump();
    return new CompleteAsyncError();
  }

  stats(): CompletionWindowStats {
    return { queued: this.pending.size - this.inFlight, inFlight: this.inFlight, ...this.counts };
  }

  /** Resolves when nothing is pending, or after `timeoutMs` (worker shutdown: what is left is retried by the server). */
  async drain(timeoutMs: number): Promise<void> {
    if (this.pending.size === 0 && this.inFlight === 0) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      this.idle.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  private findDueBeats(): void {
    const now = Date.now();
    for (const p of this.pending) {
      if (!p.beatDue && now - p.lastBeatAt >= p.beatAfterMs) {
        p.beatDue = true;
        this.beats.push(p);
      }
    }
    this.pump();
  }

  /** Fills the window: due heartbeats first (a queued completion must not time out), then completions in order. */
  private pump(): void {
    while (this.inFlight < this.limit) {
      const beat = this.beats.shift();
      if (beat) {
        if (this.pending.has(beat)) this.send(beat, 'beat');
        continue;
      }
      const next = this.queue.shift();
      if (!next) break;
      if (this.pending.has(next)) this.send(next, 'complete');
    }
    if (this.pending.size === 0 && this.inFlight === 0) {
      if (this.scan) clearInterval(this.scan);
      this.scan = undefined;
      for (const resolve of this.idle.splice(0)) resolve();
    }
  }

  private send(p: Pending, what: 'beat' | 'complete'): void {
    const client = this.client!;
    this.inFlight++;
    const call = what === 'beat' ? client.activity.heartbeat(p.token) : client.activity.complete(p.token, p.result);
    call
      .then(
        () => {
          if (what === 'beat') {
            p.beatDue = false;
            p.lastBeatAt = Date.now();
          } else {
            this.pending.delete(p);
            this.counts.completed++;
          }
        },
        (err: unknown) => this.failed(p, what, err),
      )
      .finally(() => {
        this.inFlight--;
        this.pump();
      });
  }

  private failed(p: Pending, what: 'beat' | 'complete', err: unknown): void {
    if (err instanceof ActivityNotFoundError) {
      // The server no longer waits for this activity (it timed out, or an earlier call got
      // through): its retry, if any, receives the kept reply.
      this.pending.delete(p);
      this.counts.notFound++;
      return;
    }
    if (what === 'beat') {
      // Cancellation requested, paused, or a transient error: the completion still goes out; a
      // beat that did not get through is tried again at the next scan.
      p.beatDue = false;
      if (err instanceof ActivityCancelledError) p.lastBeatAt = Date.now();
      return;
    }
    this.counts.retried++;
    const delay = p.retryDelayMs;
    p.retryDelayMs = Math.min(MAX_RETRY_DELAY_MS, p.retryDelayMs * 2);
    if (this.counts.retried % 100 === 1)
      this.log('a /run completion call failed; sending it again', { error: String(err).slice(0, 300), delayMs: delay, ...this.stats() });
    setTimeout(() => {
      this.queue.unshift(p);
      this.pump();
    }, delay).unref();
  }
}
