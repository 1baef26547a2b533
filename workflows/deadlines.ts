// Rollout deadlines that do not run while admission is held (controller.md §6). Pure data and
// functions: the training run keeps them in its state and carries them across continue-as-new.
//
// Time here is the run's deadline clock, not the workflow clock: it moves only when the clock's
// timer fires (run/deadline-clock.ts), by that timer's duration, and only if no holder holds
// admission at that moment. No decision reads `Date.now()`: the SDK may run workflow code with an
// older task's clock, and a decision taken on it can differ on replay (docs/controller.md). A
// tick that fires while held counts nothing, so a hold stops the clock for as long as it lasts on
// average; each tick's length is jittered so holds that recur at a fixed period cannot fall on the
// ticks every time. Precision: one tick, a twentieth of the budget.
// Holders are counted: a checkpoint that ends while another holder (a weight sync, a recovery)
// still holds does not restart the clock.

export interface DeadlineRegistry {
  /** Names of the current holders (a holder may hold more than once: counted). */
  holders: Record<string, number>;
  /** Running time counted so far (ms): the ticks that fired while nothing held. */
  elapsedMs: number;
  /** Capture key → the `elapsedMs` at which its budget runs out. */
  entries: Record<string, number>;
}

export function emptyDeadlines(): DeadlineRegistry {
  return { holders: {}, elapsedMs: 0, entries: {} };
}

export function holderCount(r: DeadlineRegistry): number {
  return Object.values(r.holders).reduce((a, b) => a + b, 0);
}

export function isRunning(r: DeadlineRegistry): boolean {
  for (const _ in r.holders) return false;
  return true;
}

export function isEmpty(r: DeadlineRegistry): boolean {
  for (const _ in r.entries) return false;
  return true;
}

/** Registers a deadline of `budgetMs` of running time from now (one created while held starts held). */
export function addDeadline(r: DeadlineRegistry, key: string, budgetMs: number): void {
  r.entries[key] = r.elapsedMs + budgetMs;
}

export function removeDeadline(r: DeadlineRegistry, key: string): void {
  delete r.entries[key];
}

export function remainingMs(r: DeadlineRegistry, key: string): number | undefined {
  const at = r.entries[key];
  return at === undefined ? undefined : at - r.elapsedMs;
}

/** Adds a holder: from now on no tick counts until every holder has released. */
export function hold(r: DeadlineRegistry, holder: string): void {
  r.holders[holder] = (r.holders[holder] ?? 0) + 1;
}

/** Removes one hold of `holder`. */
export function release(r: DeadlineRegistry, holder: string): void {
  const n = r.holders[holder] ?? 0;
  if (n <= 1) delete r.holders[holder];
  else r.holders[holder] = n - 1;
}

/** A tick of `ms` fired: counted only while nothing holds. True when some deadline has now run out. */
export function tick(r: DeadlineRegistry, ms: number): boolean {
  if (!isRunning(r)) return false;
  r.elapsedMs += ms;
  for (const key in r.entries) if (r.entries[key]! <= r.elapsedMs) return true;
  return false;
}

/** Keys whose budget has run out (only while running), sorted. */
export function expired(r: DeadlineRegistry): string[] {
  if (!isRunning(r)) return [];
  return Object.keys(r.entries)
    .filter((k) => r.entries[k]! <= r.elapsedMs)
    .sort();
}

/** Bounds of a tick: a twentieth of the budget, at least 0.1 s and at most 30 s. */
export const MIN_TICK_MS = 100;
export const MAX_TICK_MS = 30_000;

/** The next tick's length for a budget of `budgetMs`, jittered by `random` ∈ [0, 1) to 0.5–1.5 × the nominal tick. */
export function tickMs(budgetMs: number, random: number): number {
  const nominal = Math.min(MAX_TICK_MS, Math.max(MIN_TICK_MS, budgetMs / 20));
  return Math.max(1, Math.round(nominal * (0.5 + random)));
}
