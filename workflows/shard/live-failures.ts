// Live failures checked against Gym before they cost an attempt: the shard looks at Gym once
// (discovery, not retried) for the failures received since its last look. A server that does not
// answer or answers as a new process means they were a crash's (the run recovers, and the recovery
// restarts those siblings without charging them); the same processes all answering means each
// failure was its episode's own (retried within `max_attempts_per_sibling`). Chaos seed 109: a
// tool server killed for 1.8 s failed every episode that called it three times over, and the
// groups were given up.
import { isCancellation, log } from '@temporalio/workflow';
import type { GymTopology } from '../../protocol/controller.js';
import { describeFailure } from '../failures.js';
import { countingRollouts } from '../metrics.js';
import type { ShardContext } from './context.js';
import { settleFailures } from './reports.js';

/** The servers of `known` missing or restarted in `now` (their process identities differ). */
export function restartedSince(known: GymTopology, now: GymTopology): string[] {
  return Object.keys(known.instances).filter((name) => now.instances[name] !== known.instances[name]);
}

export async function settleLiveFailures(ctx: ShardContext): Promise<void> {
  const { st } = ctx;
  if (st.unconfirmedFailures.length === 0 || !st.topology) return;
  let crashed: string[];
  if (st.gymCrashed !== null) {
    crashed = ['(a crash already noticed)'];
  } else {
    try {
      const now = await ctx.gymProbe.discoverGym.executeWithOptions({ summary: `look at Gym after ${st.unconfirmedFailures.length} failed rollouts` }, [
        { runDir: ctx.input.gymRunDir, requireModel: ctx.input.requireModel },
      ]);
      crashed = restartedSince(st.topology, now);
    } catch (err) {
      if (isCancellation(err)) throw err;
      crashed = [`(discovery failed: ${describeFailure(err)})`];
    }
  }
  if (crashed.length > 0)
    log.warn('rollouts failed under a Gym crash: recovery restarts them without charging an attempt', {
      failures: st.unconfirmedFailures.length,
      servers: crashed,
    });
  const { toStop, gaveUp } = countingRollouts(st, () => settleFailures(st, ctx.input.maxAttemptsPerSibling, crashed.length > 0));
  ctx.toStop.push(...toStop);
  for (const g of gaveUp) log.warn('sibling gave up', { capture_key: g.key, reason: g.reason });
  ctx.wake();
}
