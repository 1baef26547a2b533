// Token-by-token generation. Both reply modes run through it, so a per-token delay makes a
// call observably "still generating" — long enough for a generation cut (cuts.ts) to stage its
// prefix mid-way, and for a continuation to decode only the rest.
import { setTimeout as sleep } from 'node:timers/promises';

export interface GenerationOptions {
  /** Wait before each token; 0 generates at once. */
  delayMs: number;
  /** Aborts generation (client gone, server closing). */
  signal: AbortSignal;
  /** First token to decode (a continuation reuses the ones before it). Default 0. */
  start?: number;
}

/** Yields token indexes start … count−1, pacing them by `delayMs`; throws once `signal` aborts. */
export async function* generateTokens(count: number, opts: GenerationOptions): AsyncGenerator<number> {
  for (let i = opts.start ?? 0; i < count; i++) {
    if (opts.delayMs > 0) await sleep(opts.delayMs, undefined, { signal: opts.signal });
    opts.signal.throwIfAborted();
    yield i;
  }
}
