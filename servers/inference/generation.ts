// Token-by-token generation. Both reply modes run through it, so a per-token delay makes a
// call observably "still generating" (the hook a later generation cut will stop mid-stream).
import { setTimeout as sleep } from 'node:timers/promises';

export interface GenerationOptions {
  /** Wait before each token; 0 generates at once. */
  delayMs: number;
  /** Aborts generation (client gone, server closing). */
  signal: AbortSignal;
}

/** Yields token indexes 0 … count−1, pacing them by `delayMs`; throws once `signal` aborts. */
export async function* generateTokens(count: number, opts: GenerationOptions): AsyncGenerator<number> {
  for (let i = 0; i < count; i++) {
    if (opts.delayMs > 0) await sleep(opts.delayMs, undefined, { signal: opts.signal });
    opts.signal.throwIfAborted();
    yield i;
  }
}
