// The shard's deadline clock (workflows/deadlines.ts): a timer that ticks while any of its rollouts
// has a deadline, each firing counted as running time unless a holder (the run's `Holds.deadlines`)
// holds the clocks at that moment. Whether a deadline ran out is decided when a timer fires (an
// event in the history), never by comparing the workflow clock, so a replay decides the same
// whatever clock its task carries.
import { condition, sleep } from '@temporalio/workflow';
import * as D from '../deadlines.js';
import type { ShardContext } from './context.js';

/** Starts the clock for this execution (nothing when the run has no `rollout_timeout_s`). */
export function startDeadlineClock(ctx: ShardContext): void {
  const budgetS = ctx.input.rolloutTimeoutS;
  if (budgetS === null) return;
  const deadlines = (): D.DeadlineRegistry => ctx.st.deadlines;
  void (async () => {
    for (;;) {
      await condition(() => !D.isEmpty(deadlines()));
      // Math.random is the workflow's seeded generator: the same on every replay.
      const ms = D.tickMs(budgetS * 1000, Math.random());
      await sleep(ms);
      if (D.tick(deadlines(), ms)) {
        ctx.expiryDue = true;
        ctx.wake();
      }
    }
  })();
}
