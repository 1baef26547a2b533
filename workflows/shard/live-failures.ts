// Live failures checked against Gym before they cost an attempt: the shard looks at Gym (discovery)
// for the failures received since its last look. A server where nothing listens (connection
// refused) or that answers as a new process means they were a crash's (the run recovers, and the
// recovery restarts those siblings without charging them); the same processes all answering means
// each failure was its episode's own (retried within `max_attempts_per_sibling`). Chaos seed 109: a
// tool server killed for 1.8 s failed every episode that called it three times over, and the
// groups were given up. A look that is inconclusive (a server too busy to answer in time, a reset
// connection, this machine out of local ports) is taken again a little later, a few times, before
// the failures count as a crash's: 16,000 episodes released at once kept Gym too busy to answer a
// status call for a while, and a recovery on that restarted 8,000 rollouts that were running fine.
import { isCancellation, log, sleep } from '@temporalio/workflow';
import type { GymTopology } from '../../protocol/controller.js';
import { describeFailure, refusedServers } from '../failures.js';
import { countingRollouts } from '../metrics.js';
import type { ShardContext } from './context.js';
import { settleFailures } from './reports.js';

/** The servers of `known` missing or restarted in `now` (their process identities differ). */
export function restartedSince(known: GymTopology, now: GymTopology): string[] {
  return Object.keys(known.instances).filter((name) => now.instances[name] !== known.instances[name]);
}

/** Inconclusive looks before the failures count as a crash's; the pauses between them double from 2 s (about a minute in all). */
const MAX_INCONCLUSIVE_LOOKS = 5;
const FIRST_PAUSE_MS = 2_000;

/** Settles the live failures received since the last look (undefined: none to settle now, see rolloutShard.ts). */
export function settleLiveFailures(ctx: ShardContext): Promise<void> | undefined {
  const { st } = ctx;
  if (st.unconfirmedFailures.length === 0 || !st.topology || ctx.lookPaused) return undefined;
  return settle(ctx, st.topology);
}

async function settle(ctx: ShardContext, topology: GymTopology): Promise<void> {
  const { st } = ctx;
  let crashed: string[];
  if (st.gymCrashed !== null) {
    crashed = ['(a crash already noticed)'];
  } else {
    const look = await lookAtGym(ctx, topology);
    if (look === 'inconclusive') {
      // Looked at again after a pause (a timer: the decision stays out of the clock).
      const pause = FIRST_PAUSE_MS * 2 ** ctx.inconclusiveLooks;
      ctx.inconclusiveLooks += 1;
      ctx.lookPaused = true;
      void sleep(pause).then(() => {
        ctx.lookPaused = false;
        ctx.wake();
      });
      return;
    }
    crashed = look;
  }
  ctx.inconclusiveLooks = 0;
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

/** The servers that crashed since `known` (gone, or answering as new processes), or 'inconclusive'. */
async function lookAtGym(ctx: ShardContext, known: GymTopology): Promise<string[] | 'inconclusive'> {
  const { st, input } = ctx;
  try {
    const now = await ctx.gymProbe.discoverGym.executeWithOptions({ summary: `look at Gym after ${st.unconfirmedFailures.length} failed rollouts` }, [
      { runDir: input.gymRunDir, requireModel: input.requireModel },
    ]);
    return restartedSince(known, now);
  } catch (err) {
    if (isCancellation(err)) throw err;
    const refused = refusedServers(err);
    if (refused.length > 0) return refused.map((name) => `${name} (connection refused)`);
    if (ctx.inconclusiveLooks + 1 >= MAX_INCONCLUSIVE_LOOKS) return [`(Gym did not answer ${MAX_INCONCLUSIVE_LOOKS} looks: ${describeFailure(err)})`];
    log.info('Gym did not answer the look after failed rollouts; looking again shortly', {
      failures: st.unconfirmedFailures.length,
      looks: ctx.inconclusiveLooks + 1,
      error: describeFailure(err).slice(0, 300),
    });
    return 'inconclusive';
  }
}
