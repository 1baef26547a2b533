// The run's continue-as-new. Its shards report by signal, up to `REPORT_SIGNALS_PER_S` together,
// and the server refuses a continue-as-new that a signal crosses (an unhandled command); the worker
// then evicts the run and replays its whole history in the next workflow task, which a steady
// stream of reports can cross again, and again. So the run first holds the shards' reports (a
// hold like admission's: messages.ts Holds), waits until those already on their way have come in,
// and continues as new with the hold in its state; the new execution releases it, and the reports
// held meanwhile go out.
import { allHandlersFinished, condition, continueAsNew, log, sleep, workflowInfo } from '@temporalio/workflow';
import type { trainingRun } from '../trainingRun.js';
import type { RunContext } from './context.js';
import { syncHolds } from './shards.js';
import { applyShardReports, type RunState } from './state.js';

/** Continue-as-new input above this (bytes of JSON) is not sent: the run keeps its history instead. */
export const MAX_CARRIED_STATE_BYTES = 256_000;
/** The reports have stopped once none came in for this long (a signal already sent is delivered within it). */
const QUIET_MS = 1_000;
/** At most this many quiet waits: a shard that had not yet seen the hold reports once more at most. */
const MAX_QUIET_WAITS = 10;

/** The history is long (or the server suggests a new one), and nothing holds the run to this execution. */
export function continueAsNewDue(ctx: RunContext): boolean {
  const info = workflowInfo();
  if (ctx.checkpointRunning || ctx.training || info.historyLength < ctx.carryRetryAt) return false;
  return info.historyLength > ctx.cfg.controller.max_history_events || info.continueAsNewSuggested;
}

/** Continues as new with the shards' reports held; returns when it cannot yet (the loop goes on). */
export async function continueAsNewQuietly(ctx: RunContext): Promise<void> {
  const { st } = ctx;
  await handlersDone(ctx);
  await ctx.retention;
  if (!carryable(ctx)) return;
  ctx.continuingAsNew = true;
  try {
    await syncHolds(ctx);
    for (let i = 0; i < MAX_QUIET_WAITS && st.shards > 0; i++) {
      const seen = ctx.reportsReceived;
      await sleep(QUIET_MS);
      if (ctx.reportsReceived === seen) break;
    }
    await handlersDone(ctx);
    // A manual checkpoint asked for meanwhile is served first (its answer is this execution's).
    if (!carryable(ctx)) return;
    applyShardReports(st);
    await continueAsNew<typeof trainingRun>({ config: ctx.cfg, state: carried(st) });
  } finally {
    // Reached only when the run goes on in this execution: the main loop's next syncHolds releases the reports.
    ctx.continuingAsNew = false;
    ctx.wake();
  }
}

/**
 * Every handler has finished, or a manual checkpoint waits for its answer: that handler finishes
 * only once the main loop has run the checkpoint, so waiting for it here would wait forever.
 */
async function handlersDone(ctx: RunContext): Promise<void> {
  await condition(() => allHandlersFinished() || ctx.manualRequested !== ctx.manualServed);
}

function carried(st: RunState): RunState {
  return { ...st, continuedAsNew: st.continuedAsNew + 1 };
}

function carryable(ctx: RunContext): boolean {
  if (ctx.checkpointRunning || ctx.manualRequested !== ctx.manualServed) return false;
  const state = carried(ctx.st);
  const bytes = JSON.stringify(state).length;
  if (bytes <= MAX_CARRIED_STATE_BYTES) return true;
  // Over the bound the run keeps its history (hard limits: 51,200 events / 50 MiB), tries again later.
  ctx.carryRetryAt = workflowInfo().historyLength + 1_000;
  log.error('run state too large to continue as new; continuing on the current history', {
    bytes,
    limit: MAX_CARRIED_STATE_BYTES,
    largest: largestFields(state),
  });
  return false;
}

/** The state's three largest fields and their bytes of JSON, for the log line that says it is too large. */
function largestFields(state: object): Record<string, number> {
  const sizes = Object.entries(state).map(([k, v]) => [k, JSON.stringify(v)?.length ?? 0] as const);
  return Object.fromEntries(sizes.sort((a, b) => b[1] - a[1]).slice(0, 3));
}
