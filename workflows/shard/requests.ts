// A shard's answers to the requests of the run and of checkpoint attempts (messages.ts
// ShardRequest): its part of a checkpoint's cut, of a recovery, of a training step. Each request
// is answered once, to the workflow that asked.
import { condition, isCancellation, log, sleep } from '@temporalio/workflow';
import type { AnswerDelivery } from '../../activities/shard-signals.js';
import type { FileDigest } from '../../protocol/controller.js';
import type { CaptureKey, EpisodeId } from '../../protocol/episode-id.js';
import { describeFailure } from '../failures.js';
import * as L from '../ledger.js';
import type { ShardAnswer, ShardRequest } from '../messages.js';
import { planRecovery, restoredRollouts, settleRecovery } from '../recovery-plan.js';
import type { ShardContext } from './context.js';
import { forgetAll } from './dispatch.js';
import { groupIndex, rememberAnswered } from './state.js';
import { takeReports } from './stops.js';

/** Answers every request that can be answered now; a `drain` waits until nothing is in flight (undefined: none answerable now). */
export function answerRequests(ctx: ShardContext): Promise<void> | undefined {
  return answerable(ctx) ? answerAll(ctx) : undefined;
}

function answerable(ctx: ShardContext): boolean {
  const req = ctx.st.requests[0];
  return req !== undefined && !(req.kind === 'drain' && Object.keys(ctx.st.inFlight).length > 0);
}

async function answerAll(ctx: ShardContext): Promise<void> {
  const { st } = ctx;
  while (answerable(ctx)) {
    const req = st.requests[0]!;
    const sent = req.kind === 'candidates' ? await answerWithCut(ctx, req) : await sendAnswer(ctx, req, await answerOf(ctx, req));
    st.requests.shift();
    rememberAnswered(st, req.id);
    if (!sent.delivered) log.warn('the workflow that asked is gone', { request: req.kind, replyTo: req.replyTo, error: sent.error });
  }
}

async function answerOf(ctx: ShardContext, req: Exclude<ShardRequest, { kind: 'candidates' }>): Promise<Omit<ShardAnswer, 'id' | 'shard'>> {
  try {
    return await handle(ctx, req);
  } catch (err) {
    if (isCancellation(err)) throw err;
    return { error: describeFailure(err) };
  }
}

/**
 * From a local activity: a signal command would cost the shard one more workflow task to see its
 * delivery recorded (activities/shard-signals.ts).
 */
function sendAnswer(ctx: ShardContext, req: ShardRequest, answer: Omit<ShardAnswer, 'id' | 'shard'>): Promise<AnswerDelivery> {
  return ctx.signals.answerShardRequest({ replyTo: req.replyTo, answer: { id: req.id, shard: ctx.input.shard, ...answer } }).catch((err: unknown) => {
    if (isCancellation(err)) throw err;
    return { delivered: false, error: String(err) };
  });
}

async function handle(ctx: ShardContext, req: Exclude<ShardRequest, { kind: 'candidates' }>): Promise<Omit<ShardAnswer, 'id' | 'shard'>> {
  const { st, input } = ctx;
  switch (req.kind) {
    case 'recut':
      return { part: await recut(ctx, req.tmpDir, req.unsettled, req.waitMs) };
    case 'drain':
      if (req.forget) await forgetAll(ctx);
      return {};
    case 'planRestore': {
      if (st.loadError) throw new Error(st.loadError);
      const saved = req.snapshotDir ? await ctx.files.scopeSlice({ snapshotDir: req.snapshotDir, shard: input.shard, shards: input.shards }) : [];
      const plan = planRecovery(st.ledger, { lastSnapshot: req.snapshotDir, lastSnapshotScope: saved });
      st.restorePlan = plan;
      const scope = plan.scope.map((e): [string, number, string] => [e.rollout_id, e.attempt, plan.environments[e.rollout_id]!]);
      return ctx.files.writeScopePart({ dir: req.dir, shard: input.shard, scope });
    }
    case 'settleRecovery':
      return settle(ctx, req);
    case 'consume':
      return consume(ctx, req.groups, req.batchFile);
    case 'ledgerPart':
      return { part: await ctx.files.writeLedgerPart({ dir: req.dir, shard: input.shard, ledger: st.ledger, create: true }) };
  }
}

/** The scope's candidates: attempts in flight, and restored replacements (N+1) not dispatched yet (a scope that left them out would delete their saved turns). */
function candidates(ctx: ShardContext): EpisodeId[] {
  const { st } = ctx;
  return [
    ...Object.values(st.inFlight).map((f) => f.episode),
    ...L.reservedAttempts(st.ledger)
      .filter(({ attempt }) => attempt.continued)
      .map(({ sibling, attempt }) => L.episodeOfAttempt(sibling, attempt)),
  ];
}

/**
 * The shard's side of a checkpoint's cut, written the moment admission closes (before Gym
 * prepares): the scope's candidates and the ledger slice as it stands, side by side, and the
 * answer with them, all in one local activity (it stays out of the history, and the shard takes two
 * activations while admission is closed). Until Gym's cut the slice can change only by attempts
 * that end, and Gym commits none of those: the commit names them and the shard writes its part
 * again (recut). So no second round of requests runs beside the commit.
 */
async function answerWithCut(ctx: ShardContext, req: Extract<ShardRequest, { kind: 'candidates' }>): Promise<AnswerDelivery> {
  const { st, input } = ctx;
  takeReports(ctx);
  const inFlight = new Set(Object.keys(st.inFlight));
  try {
    const sent = await ctx.signals.answerWithCut(
      { replyTo: req.replyTo, answer: { id: req.id, shard: input.shard }, cut: { tmpDir: req.tmpDir, shard: input.shard, episodes: candidates(ctx) } },
      jsonBytes(st.ledger),
    );
    if (sent.part) {
      ctx.lastCutInFlight = inFlight;
      ctx.lastCutPart = sent.part;
    }
    return sent;
  } catch (err) {
    if (isCancellation(err)) throw err;
    // The activity failed as a whole (it answers a failed write itself): the asker still hears why.
    return sendAnswer(ctx, req, { error: describeFailure(err) });
  }
}

/**
 * A value's JSON text in UTF-8, as a binary argument: the SDK passes bytes to an activity as they
 * are, where a JSON argument costs a stringify and its JavaScript UTF-8 encoder here, and the
 * decoder and a parse on the worker's main thread, which then stringifies it again to write it: the
 * bulk of both threads' work while admission is closed (docs/performance.md). The copy makes the
 * array this sandbox's own (its TextEncoder is Node's), which the SDK's binary converter requires.
 */
function jsonBytes(value: unknown): Uint8Array {
  return new Uint8Array(new TextEncoder().encode(JSON.stringify(value)));
}

/** The ledger slice as it stands, into the temp snapshot; remembers what was in flight then (recut). */
async function writeLedgerCut(ctx: ShardContext, tmpDir: string): Promise<FileDigest> {
  ctx.lastCutInFlight = new Set(Object.keys(ctx.st.inFlight));
  const part = await ctx.files.writeLedgerPart({ dir: tmpDir, shard: ctx.input.shard, ledger: ctx.st.ledger });
  ctx.lastCutPart = part;
  return part;
}

/**
 * Gym did not commit `unsettled` (they finished before its cut: their `/run` replies are on the
 * wire). If none of them was in flight when the part was written, it holds them already; else
 * wait briefly for their reports and write it again.
 */
async function recut(ctx: ShardContext, tmpDir: string, unsettled: CaptureKey[], waitMs: number): Promise<FileDigest> {
  if (ctx.lastCutPart && !unsettled.some((k) => ctx.lastCutInFlight.has(k))) return ctx.lastCutPart;
  let timedOut = false;
  void sleep(waitMs).then(() => (timedOut = true));
  const settled = (): boolean => unsettled.every((k) => !ctx.st.inFlight[k]);
  for (;;) {
    takeReports(ctx);
    if (settled() || timedOut) break;
    await condition(() => ctx.st.reports.length > 0 || timedOut);
  }
  return writeLedgerCut(ctx, tmpDir);
}

async function settle(ctx: ShardContext, req: Extract<ShardRequest, { kind: 'settleRecovery' }>): Promise<Omit<ShardAnswer, 'id' | 'shard'>> {
  const { st, input } = ctx;
  const plan = st.restorePlan ?? { scope: [], environments: {} };
  const installed = await ctx.files.restoredSlice({ dir: req.dir, shard: input.shard, shards: input.shards });
  const settled = settleRecovery(st.ledger, plan, { restored: restoredRollouts(plan, installed), restoreFailed: req.restoreFailed, cold: req.cold });
  st.restorePlan = null;
  st.topology = req.topology;
  st.completed -= settled.superseded;
  // A harness of a dead attempt that outlived the crash must not write into the rerun.
  if (settled.retire.length > 0) {
    await ctx.control.gymRetire({ topology: req.topology, timeoutS: input.gymTimeoutS, episodes: settled.retire }).catch((err: unknown) => {
      log.warn('retiring the dead attempts failed (fresh processes hold nothing of them)', { error: String(err) });
    });
  }
  st.gymCrashed = null;
  st.crashReported = false;
  st.epoch += 1;
  return {
    continued: settled.continued.length,
    continuedKeys: settled.continued.slice(0, 100),
    restarted: settled.restarted.length,
    assigned: st.assigned,
    unfinished: L.unfinishedGroupCount(st.ledger),
  };
}

/** Hands sealed groups over to a training step: their batch part (if the trainer reads one), then they leave the slice. */
async function consume(ctx: ShardContext, indexes: number[], batchFile: string | null): Promise<Omit<ShardAnswer, 'id' | 'shard'>> {
  const { st } = ctx;
  const wanted = new Set(indexes);
  const groups = st.ledger.order.map((id) => st.ledger.groups[id]!).filter((g) => g.status === 'ready_to_finalize' && wanted.has(groupIndex(g)));
  if (groups.length !== indexes.length) throw new Error(`consume: ${indexes.length - groups.length} of the groups are not sealed in shard ${ctx.input.shard}`);
  let rewardSum = 0;
  let live = 0;
  const batch = groups.map((g) => ({
    group_id: g.group_id,
    siblings: g.siblings.map((s) => {
      const a = L.currentAttempt(s);
      const mask = a.mask_sample ?? true;
      if (!mask) {
        rewardSum += a.reward ?? 0;
        live += 1;
      }
      return { rollout_id: s.rollout_id, reward: a.reward ?? 0, mask, captureKeys: L.lineageKeys(s) };
    }),
  }));
  if (batchFile !== null) await ctx.files.writeBatchPart({ file: batchFile, batch });
  for (const g of groups) {
    L.consumeGroup(st.ledger, g.group_id);
    st.forgetQueue.push(...L.rolloutIds(g));
  }
  return { batchFile, rewardSum, live };
}
