// Waiting in tests: one poll (vitest's `vi.waitFor`) and one sleep for the whole suite.
import { setTimeout as sleep } from 'node:timers/promises';
import { vi } from 'vitest';

export { sleep };

type Condition<T> = () => T | Promise<T>;

export interface WaitOptions {
  timeoutMs?: number;
  intervalMs?: number;
}

/**
 * Polls `cond` until it returns a truthy value, and returns it; fails after the timeout (20 s by
 * default) naming `what` (or the condition's source) and the last value or error seen.
 */
export function waitFor<T>(cond: Condition<T>, opts?: number | WaitOptions): Promise<NonNullable<T>>;
export function waitFor<T>(what: string, cond: Condition<T>, opts?: number | WaitOptions): Promise<NonNullable<T>>;
export async function waitFor<T>(a: string | Condition<T>, b?: Condition<T> | number | WaitOptions, c?: number | WaitOptions): Promise<NonNullable<T>> {
  const [what, cond, opts] = typeof a === 'string' ? [a, b as Condition<T>, c] : [String(a), a, b as number | WaitOptions | undefined];
  const { timeoutMs = 20_000, intervalMs = 10 } = typeof opts === 'number' ? { timeoutMs: opts } : (opts ?? {});
  let last: unknown;
  try {
    return await vi.waitFor(
      async () => {
        try {
          last = await cond();
        } catch (err) {
          last = err;
        }
        if (!last || last instanceof Error) throw new Error('not yet');
        return last as NonNullable<T>;
      },
      { timeout: timeoutMs, interval: intervalMs },
    );
  } catch {
    const seen = last instanceof Error ? last.message : JSON.stringify(last);
    throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${seen})`);
  }
}
