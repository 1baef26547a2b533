// Deadline accounting for control calls: `deadline_ts` is absolute epoch seconds shared by every
// participant of one fan-out (control-plane.md §4).
import { refuse } from '../../protocol/errors.js';

export function nowSeconds(): number {
  return Date.now() / 1000;
}

export function remainingMs(deadlineTs: number): number {
  return Math.max(0, deadlineTs * 1000 - Date.now());
}

/**
 * Awaits `work` until the deadline. When it passes first the call fails with
 * `deadline_exceeded`, but `work` keeps running: a retry of the same call awaits it.
 */
export async function boundByDeadline<T>(work: Promise<T>, deadlineTs: number, what: string): Promise<T> {
  // With the deadline already past, work that has finished still counts (a 0 ms timer runs after
  // the microtasks of a settled promise); only unfinished work is refused.
  const ms = remainingMs(deadlineTs);
  if (ms === Number.POSITIVE_INFINITY) return work;
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(refuse('deadline_exceeded', `deadline passed before ${what} finished`)), ms);
  });
  try {
    return await Promise.race([work, expired]);
  } finally {
    clearTimeout(timer);
    work.catch(() => undefined);
  }
}

/** An AbortSignal that aborts at the deadline (for hooks that stop work themselves). */
export function deadlineSignal(deadlineTs: number): { signal: AbortSignal; dispose: () => void } {
  const ac = new AbortController();
  const ms = remainingMs(deadlineTs);
  if (ms === Number.POSITIVE_INFINITY) return { signal: ac.signal, dispose: () => undefined };
  if (ms <= 0) {
    ac.abort(refuse('deadline_exceeded', 'deadline passed'));
    return { signal: ac.signal, dispose: () => undefined };
  }
  const t = setTimeout(() => ac.abort(refuse('deadline_exceeded', 'deadline passed')), ms);
  return { signal: ac.signal, dispose: () => clearTimeout(t) };
}
