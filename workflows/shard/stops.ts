// The attempts a shard tells to stop: their deadline expired (the shard keeps the clock, held
// while the run holds it), or their cohort starts over without them.
import { getExternalWorkflowHandle, log } from '@temporalio/workflow';
import * as D from '../deadlines.js';
import { deadlineExpired, stopAttempt } from '../messages.js';
import { countingRollouts } from '../metrics.js';
import { captureKey } from '../../protocol/episode-id.js';
import type { ShardContext } from './context.js';
import type { InFlight } from './state.js';
import { applyReports } from './reports.js';

/** Applies the reports received so far; the attempts it abandons are stopped by stopAbandoned(). */
export function takeReports(ctx: ShardContext): void {
  const { toStop, gaveUp } = countingRollouts(ctx.st, () => applyReports(ctx.st, ctx.input.maxAttemptsPerSibling));
  ctx.toStop.push(...toStop);
  for (const g of gaveUp) log.warn('sibling gave up', { capture_key: g.key, reason: g.reason });
}

/** Tells the attempts whose cohort started over without them to stop (undefined: none to tell, see rolloutShard.ts). */
export function stopAbandoned(ctx: ShardContext): Promise<void> | undefined {
  if (ctx.toStop.length === 0) return undefined;
  const flights = ctx.toStop;
  ctx.toStop = [];
  return signalStops(ctx, flights);
}

async function signalStops(ctx: ShardContext, flights: InFlight[]): Promise<void> {
  for (const f of flights) {
    if (f.stopSignalled) continue;
    f.stopSignalled = true;
    await getExternalWorkflowHandle(f.workflowId)
      .signal(stopAttempt, 'its cohort starts over')
      .catch(() => stopUndelivered(ctx, f));
  }
}

/**
 * A stop that did not reach its attempt (a signal fails only when the workflow is gone): it ended
 * without seeing the stop, so without retiring anything, and a completed report its `/run` sent
 * counts (held until now, or still on its way).
 */
function stopUndelivered(ctx: ShardContext, f: InFlight): void {
  const { st } = ctx;
  if (st.inFlight[captureKey(f.episode)] !== f) return;
  f.stopUndelivered = true;
  if (!f.heldReport) return;
  st.reports.push(f.heldReport);
  delete f.heldReport;
  ctx.wake();
}

/** Tells the attempts whose deadline expired (the deadline clock's last tick said so) to stop (undefined: none due). */
export function signalExpired(ctx: ShardContext): Promise<void> | undefined {
  const { st } = ctx;
  // Held since the tick: looked at again once the holders release.
  if (!ctx.expiryDue || !D.isRunning(st.deadlines)) return undefined;
  ctx.expiryDue = false;
  return signalDeadlines(ctx);
}

async function signalDeadlines(ctx: ShardContext): Promise<void> {
  const { st } = ctx;
  for (const key of D.expired(st.deadlines)) {
    const flight = st.inFlight[key];
    D.removeDeadline(st.deadlines, key);
    if (!flight || flight.stopSignalled) continue;
    flight.stopSignalled = true;
    await getExternalWorkflowHandle(flight.workflowId)
      .signal(deadlineExpired)
      .catch(() => stopUndelivered(ctx, flight));
  }
}
