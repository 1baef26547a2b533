// Rollout deadlines that do not run while admission is held (controller.md §6). Pure data and
// functions, so the training-run workflow can keep them in its state (deterministic) and carry
// them across continue-as-new. Holders are counted: a checkpoint that ends while another holder
// (a weight sync, a second checkpoint) still holds does not restart the clocks.

export interface DeadlineEntry {
  /** Budget left when the clocks last stopped (ms). */
  bankedMs: number;
  /** Workflow time (ms) when the clocks last started; null while held. */
  runningSince: number | null;
}

export interface DeadlineRegistry {
  /** Names of the current holders (a holder may hold more than once: counted). */
  holders: Record<string, number>;
  entries: Record<string, DeadlineEntry>;
}

export function emptyDeadlines(): DeadlineRegistry {
  return { holders: {}, entries: {} };
}

export function holderCount(r: DeadlineRegistry): number {
  return Object.values(r.holders).reduce((a, b) => a + b, 0);
}

export function isRunning(r: DeadlineRegistry): boolean {
  return holderCount(r) === 0;
}

/** Registers a deadline of `budgetMs`; one created while held starts held. */
export function addDeadline(r: DeadlineRegistry, key: string, budgetMs: number, now: number): void {
  r.entries[key] = { bankedMs: budgetMs, runningSince: isRunning(r) ? now : null };
}

export function removeDeadline(r: DeadlineRegistry, key: string): void {
  delete r.entries[key];
}

export function remainingMs(e: DeadlineEntry, now: number): number {
  return e.runningSince === null ? e.bankedMs : e.bankedMs - (now - e.runningSince);
}

/** Adds a holder; the first one banks every running deadline and stops the clocks. */
export function hold(r: DeadlineRegistry, holder: string, now: number): void {
  if (isRunning(r)) {
    for (const e of Object.values(r.entries)) {
      e.bankedMs = remainingMs(e, now);
      e.runningSince = null;
    }
  }
  r.holders[holder] = (r.holders[holder] ?? 0) + 1;
}

/** Removes one hold of `holder`; when none is left the clocks restart with the banked budgets. */
export function release(r: DeadlineRegistry, holder: string, now: number): void {
  const n = r.holders[holder] ?? 0;
  if (n <= 1) delete r.holders[holder];
  else r.holders[holder] = n - 1;
  if (isRunning(r)) {
    for (const e of Object.values(r.entries)) if (e.runningSince === null) e.runningSince = now;
  }
}

/** Keys whose budget ran out by `now` (only while running). */
export function expired(r: DeadlineRegistry, now: number): string[] {
  if (!isRunning(r)) return [];
  return Object.entries(r.entries)
    .filter(([, e]) => remainingMs(e, now) <= 0)
    .map(([k]) => k)
    .sort();
}

/** Milliseconds until the next expiry, or undefined when nothing can expire (held or empty). */
export function nextExpiryMs(r: DeadlineRegistry, now: number): number | undefined {
  if (!isRunning(r)) return undefined;
  let min: number | undefined;
  for (const e of Object.values(r.entries)) {
    const left = remainingMs(e, now);
    if (min === undefined || left < min) min = left;
  }
  return min === undefined ? undefined : Math.max(0, min);
}
