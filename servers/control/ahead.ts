// Work of a future commit done ahead, while no checkpoint is open. A participant's commit spends
// most of its time making the JSON text of each record's boundary; a boundary never changes once
// recorded (a new one replaces it), and most of an episode's life is spent parked on a model call or
// a tool call at one. So the plane lets the kind make those texts in short slices between requests,
// for boundaries that have not moved since the previous scan, and the commit finds them made: what
// is left for the window are the boundaries that moved since (docs/performance.md).
import { setImmediate as nextTurn } from 'node:timers/promises';

/** How often the kind's staging runs; a boundary is staged once it was there on two scans. */
export const AHEAD_SCAN_MS = 1_000;
/** Longest slice of staging between two turns of the event loop: requests wait at most this long. */
export const AHEAD_SLICE_MS = 8;

/**
 * Which objects were there on an earlier scan too. A boundary seen on two scans has stood for a
 * scan interval: an episode parked on a call, worth making the text of. One replaced within the
 * interval (a fast turn) is never staged: the text of a boundary no checkpoint sees is wasted.
 */
export class SteadyObjects {
  private readonly seen = new WeakSet<object>();

  /** True from the second scan that passes `o` to this on. */
  steady(o: object): boolean {
    if (this.seen.has(o)) return true;
    this.seen.add(o);
    return false;
  }
}

export interface AheadStagingOptions {
  /** The kind's staging: one unit of work (one record's texts) per step of the iteration. */
  stage: () => Iterable<unknown>;
  /** False while a checkpoint is open (its commit does the work itself) or once the plane closed. */
  idle: () => boolean;
  scanMs?: number;
  sliceMs?: number;
  log?: (msg: string, err?: unknown) => void;
}

/** Runs `stage` every `scanMs` while `idle`, in slices of at most `sliceMs`; stops when a checkpoint opens. */
export class AheadStaging {
  private readonly timer: NodeJS.Timeout;
  private running = false;
  private stopped = false;
  private readonly sliceMs: number;

  constructor(private readonly opts: AheadStagingOptions) {
    this.sliceMs = opts.sliceMs ?? AHEAD_SLICE_MS;
    this.timer = setInterval(() => void this.scan(), opts.scanMs ?? AHEAD_SCAN_MS);
    this.timer.unref();
  }

  /** One scan (the timer's; exposed for tests). Resolves when it finished or gave way to a checkpoint. */
  async scan(): Promise<void> {
    if (this.running || this.stopped || !this.opts.idle()) return;
    this.running = true;
    try {
      const steps = this.opts.stage()[Symbol.iterator]();
      for (;;) {
        const sliceEnd = performance.now() + this.sliceMs;
        let done = false;
        while (!(done = steps.next().done === true) && performance.now() < sliceEnd);
        if (done) return;
        await nextTurn();
        if (this.stopped || !this.opts.idle()) {
          steps.return?.();
          return;
        }
      }
    } catch (err) {
      // A record that cannot be serialized fails its commit, which says so; staging just stops.
      this.opts.log?.('staging records ahead of a checkpoint failed', err);
    } finally {
      this.running = false;
    }
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }
}
