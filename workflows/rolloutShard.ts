// One rollout shard of a training run (ID `<run>/shard/<k>`): it owns the prompt groups the run
// assigns it — their ledger slice, their attempts (started as its own children), deadlines, live
// failures and retries, their part of every checkpoint cut and recovery — and tells the run, in
// batches, which groups are sealed. So the run owns no attempt and carries nothing per rollout:
// Temporal's default limits allow 2,000 pending children per workflow and a few signals a second
// into one, and one workflow should carry well under 256 KB of state (docs/controller.md).
import {
  allHandlersFinished,
  condition,
  continueAsNew,
  defineQuery,
  getExternalWorkflowHandle,
  isCancellation,
  log,
  setHandler,
  sleep,
  workflowInfo,
} from '@temporalio/workflow';
import { packJson, unpackJson } from '../protocol/packed-json.js';
import * as L from './ledger.js';
import { checkLedger } from './ledger-invariants.js';
import {
  assignGroups,
  closeShard,
  rolloutFinished,
  rolloutsFinished,
  sealedAttempt,
  setHolds,
  shardReport,
  shardRequest,
  type ShardReport,
} from './messages.js';
import { ShardContext, type RolloutShardInput } from './shard/context.js';
import { startDeadlineClock } from './shard/deadline-clock.js';
import { dispatch, forgetFinished } from './shard/dispatch.js';
import { settleLiveFailures } from './shard/live-failures.js';
import { answerRequests } from './shard/requests.js';
import { applyHolds, groupIndex, initialShardState, knownRequest, type ShardState } from './shard/state.js';
import { signalExpired, stopAbandoned, takeReports } from './shard/stops.js';

export type { RolloutShardInput } from './shard/context.js';

export interface ShardStatus {
  shard: number;
  inFlight: number;
  groups: number;
  reserved: number;
  holds: string[];
}
export const shardStatus = defineQuery<ShardStatus>('shardStatus');

export { shardWorkflowId } from './shard-id.js';

export async function rolloutShard(input: RolloutShardInput): Promise<void> {
  const st: ShardState = input.carried ? unpackJson<ShardState>(input.carried) : initialShardState(input.run, input.holds);
  const ctx = new ShardContext(input, st);
  /** What the run last heard (in flight, unfinished): a change is worth a report. */
  let told = { inFlight: -1, unfinished: -1 };

  setHandler(assignGroups, (a) => {
    for (const g of a.groups) if (!st.ledger.groups[g.group_id]) L.reserveGroup(st.ledger, g);
    st.assigned += a.groups.length;
    st.topology = a.topology;
    ctx.wake();
  });
  setHandler(setHolds, (h) => {
    // Woken also when the reports' hold is released: what was held goes out.
    if (applyHolds(st, h)) ctx.wake();
  });
  setHandler(rolloutFinished, (r) => {
    st.reports.push(r);
    ctx.wake();
  });
  setHandler(rolloutsFinished, (rs) => {
    st.reports.push(...rs);
    ctx.wake();
  });
  setHandler(shardRequest, (r) => {
    if (knownRequest(st, r.id)) return;
    // A checkpoint's candidates request carries its holds: nothing is dispatched after it arrives.
    if (r.kind === 'candidates') applyHolds(st, r.holds);
    st.requests.push(r);
    ctx.wake();
  });
  setHandler(closeShard, () => {
    st.closed = true;
    ctx.wake();
  });
  setHandler(sealedAttempt, (episode) => L.sealedOutcome(st.ledger, episode) ?? null);
  setHandler(shardStatus, () => ({
    shard: input.shard,
    inFlight: Object.keys(st.inFlight).length,
    groups: st.ledger.order.length,
    reserved: L.reservedAttempts(st.ledger).length,
    holds: st.holds.admission,
  }));

  if (!input.carried && input.load) await loadSlice(ctx, input.load);
  startDeadlineClock(ctx);

  /** Sends the run what it has not heard yet (undefined: nothing to send now); the pause before the next report is a timer (see docs/controller.md). */
  function report(): Promise<void> | undefined {
    const inFlight = Object.keys(st.inFlight).length;
    const unfinished = L.unfinishedGroupCount(st.ledger);
    const crash = st.gymCrashed !== null && !st.crashReported;
    const news = st.sealed.length > 0 || st.completed !== 0 || st.failed !== 0 || crash || inFlight !== told.inFlight || unfinished !== told.unfinished;
    if (!news || (ctx.pacing && !st.closed && !crash)) return undefined;
    // The run is continuing as new: a signal now would make the server refuse it (run/carry.ts).
    if (st.holds.reports.length > 0) return undefined;
    return sendReport(inFlight, unfinished, crash);
  }

  async function sendReport(inFlight: number, unfinished: number, crash: boolean): Promise<void> {
    ctx.pacing = true;
    void sleep(input.flushIntervalMs).then(() => {
      ctx.pacing = false;
      ctx.wake();
    });
    const r: ShardReport = {
      shard: input.shard,
      sealed: st.sealed,
      completed: st.completed,
      failed: st.failed,
      assigned: st.assigned,
      inFlight,
      unfinished,
      epoch: st.epoch,
      ...(crash ? { gymCrashed: st.gymCrashed! } : {}),
    };
    try {
      await getExternalWorkflowHandle(input.runWorkflowId).signal(shardReport, r);
    } catch (err) {
      if (isCancellation(err)) throw err;
      log.warn('the run is gone; nothing to report to', { error: String(err) });
      st.closed = true;
    }
    st.sealed = st.sealed.slice(r.sealed.length);
    st.completed -= r.completed;
    st.failed -= r.failed;
    if (crash) st.crashReported = true;
    told = { inFlight, unfinished };
  }

  // Each step returns a promise only when it has work: the SDK's promise hook records a stack trace
  // for every promise a workflow makes, a large share of a shard's workflow task time (docs/performance.md).
  const steps: ReadonlyArray<() => Promise<void> | undefined> = [
    () => settleLiveFailures(ctx),
    () => stopAbandoned(ctx),
    () => signalExpired(ctx),
    () => answerRequests(ctx),
    () => dispatch(ctx),
    () => forgetFinished(ctx, st.closed),
    report,
  ];
  for (;;) {
    ctx.changed = false;
    takeReports(ctx);
    for (const step of steps) {
      const work = step();
      if (work) await work;
    }
    // Closed by the run at its end (or it is gone): done once nothing of it is in flight.
    if (st.closed && Object.keys(st.inFlight).length === 0 && st.requests.length === 0 && st.sealed.length === 0) return;
    const info = workflowInfo();
    if ((info.historyLength > input.maxHistoryEvents || info.continueAsNewSuggested) && st.requests.length === 0) {
      await condition(allHandlersFinished);
      const { load: _load, ...rest } = input;
      await continueAsNew<typeof rolloutShard>({ ...rest, carried: packJson(st) });
    }
    if (!ctx.changed) await condition(() => ctx.changed);
  }
}

/** A cold start: the shard's slice of a saved ledger, its sealed siblings counted, its sealed groups announced. */
async function loadSlice(ctx: ShardContext, from: NonNullable<RolloutShardInput['load']>): Promise<void> {
  const { st, input } = ctx;
  const packed = await ctx.files.loadLedgerSlice({ from, shard: input.shard, shards: input.shards });
  const slice = unpackJson<L.Ledger>(packed);
  try {
    checkLedger(slice);
  } catch (err) {
    // Answered to the recovery's plan request: the cold start refuses the checkpoint.
    st.loadError = `the ledger slice of shard ${input.shard} is invalid: ${(err as Error).message}`;
    return;
  }
  st.ledger = { ...slice, run: input.run, cursor: 0 };
  for (const id of st.ledger.order) {
    const g = st.ledger.groups[id]!;
    st.completed += g.siblings.filter((s) => L.currentAttempt(s).status === 'sealed').length;
    if (g.status === 'ready_to_finalize') st.sealed.push(groupIndex(g));
  }
}
