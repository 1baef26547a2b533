// Recovery after a Gym crash, with the controller alive (design.md "Recovery"): wait for Gym, let
// every attempt in flight report, restore the latest published snapshot all-or-nothing into the
// fresh processes, settle what each unfinished sibling becomes. The shards plan and settle their
// own slices (recovery-plan.ts); the run holds admission, waits for Gym and makes the one restore
// call over every shard's part of the scope. Sealed work is never redone: it is in the shards'
// histories.
import { ApplicationFailure, isCancellation, log, setCurrentDetails, sleep, uuid4 } from '@temporalio/workflow';
import { recoveryDir, type GymTopology } from '../../protocol/controller.js';
import type { CaptureKey } from '../../protocol/episode-id.js';
import { describeFailure } from '../failures.js';
import type { ShardAnswer } from '../messages.js';
import { recoveryRecorded } from '../metrics.js';
import { allShards } from '../shard-asker.js';
import { armCheckpointTimer, record, retryPending } from './checkpoints.js';
import type { RunContext } from './context.js';
import { shardTopology } from './dispatch.js';
import { ensureShards, syncHolds } from './shards.js';
import { keepRecovery, type RecoveryRecord } from './state.js';

/** `cold`: the first recovery of a run that took over another's checkpoint directory. */
export async function recoverGym(ctx: RunContext, cold = false): Promise<void> {
  const { st, cfg } = ctx;
  ctx.recovering = true;
  const rec: RecoveryRecord = { at: new Date().toISOString(), restoreId: null, snapshotDir: st.lastSnapshot, continued: 0, restarted: 0, continuedSample: [] };
  let continuedPerShard: CaptureKey[][] = [];
  try {
    await ensureShards(ctx);
    // Gym first: attempts in flight report only once their processes answer again. While Gym is
    // down their clocks stop (the deadline hold), or a crash would spend them.
    st.topology = await waitForGym(ctx);
    // Gym is up: the failures before this were its crash, not a Gym that does not recover.
    st.consecutiveFailures = 0;
    // A checkpoint left prepared (its abort or release pending) holds the surviving processes'
    // episodes at their boundaries: release it first, or they never report.
    await settlePending(ctx);
    // The attempts still in flight on surviving processes run as usual until they report,
    // deadlines included (a hung one is stopped at its deadline instead of holding this).
    requireAll('drain', await ctx.shardsAsk.ask(allShards(st.shards), () => ({ kind: 'drain' })));
    // Again: a second crash may have come while the attempts reported.
    const topology = await waitForGym(ctx);
    st.topology = topology;
    const restoreId = `restore-${uuid4().replace(/-/g, '')}`;
    const dir = recoveryDir(cfg.run.checkpoint_dir, restoreId);
    const plans = await ctx.shardsAsk.ask(allShards(st.shards), () => ({ kind: 'planRestore', snapshotDir: st.lastSnapshot, dir }));
    const badSlice = plans.find((a) => a.error?.includes('ledger slice'));
    if (cold && badSlice) throw ApplicationFailure.nonRetryable(`restore_mode latest: ${badSlice.error}`, 'invalid_restore');
    const planned = requireAll('plan', plans);
    const scopeCount = planned.reduce((n, a) => n + (a.count ?? 0), 0);
    let restoreFailed = false;
    if (scopeCount > 0 && st.lastSnapshot) {
      rec.restoreId = restoreId;
      const timeoutS = cfg.rollout_checkpointing.gym.prepare_timeout_s;
      try {
        await ctx.control.gymRestore.executeWithOptions({ summary: `restore ${scopeCount} episodes from ${st.lastSnapshot}` }, [
          { topology, restoreId, timeoutS, checkpointDir: st.lastSnapshot, scope: { dir, shards: st.shards } },
        ]);
        await ctx.control.gymResume({ topology, checkpointId: restoreId, timeoutS });
      } catch (err) {
        // All or nothing: the coordination client retired the replacements N+1 everywhere.
        restoreFailed = true;
        rec.error = describeFailure(err);
        log.warn('restore after the Gym crash failed; unfinished work starts over', { error: rec.error });
      }
    }
    const settled = requireAll(
      'settle',
      await ctx.shardsAsk.ask(allShards(st.shards), () => ({ kind: 'settleRecovery', dir, restoreFailed, cold, topology: shardTopology(topology) })),
    );
    for (const a of settled) st.reported[a.shard] = { assigned: a.assigned ?? 0, unfinished: a.unfinished ?? 0, inFlight: 0 };
    st.recoveryEpoch += 1;
    rec.continued = settled.reduce((n, a) => n + (a.continued ?? 0), 0);
    rec.restarted = settled.reduce((n, a) => n + (a.restarted ?? 0), 0);
    continuedPerShard = settled.map((a) => a.continuedKeys ?? []);
    recoveryRecorded(cold, restoreFailed ? 'restore_failed' : rec.restoreId ? 'restored' : 'nothing_to_restore', rec.continued, rec.restarted);
    await ctx.storage.removeControllerDir({ dir });
    log.info('recovered from a Gym crash', { continued: rec.continued, restarted: rec.restarted });
  } finally {
    keepRecovery(st, rec, continuedPerShard);
    st.recoveryNeeded = false;
    ctx.recovering = false;
    ctx.gymDown = false;
    await syncHolds(ctx);
    ctx.wake();
  }
}

/** Every shard did its part, or the run cannot know what its ledger holds. */
function requireAll(step: string, answers: ShardAnswer[]): ShardAnswer[] {
  const failed = answers.filter((a) => a.error !== undefined);
  if (failed.length > 0)
    throw ApplicationFailure.nonRetryable(`recovery (${step}): ${failed.map((a) => `shard ${a.shard}: ${a.error}`).join('; ')}`, 'invariant_error');
  return answers;
}

/**
 * Discovery until every Gym participant answers: after a crash the run's normal state, not a
 * failure. Retried with backoff up to `controller.gym_recovery_timeout_s`; meanwhile the status
 * phase is `waiting_for_gym`, the shards' deadline clocks are held, and the UI shows the pending
 * discovery with its attempts.
 */
async function waitForGym(ctx: RunContext): Promise<GymTopology> {
  const { st, cfg } = ctx;
  const timeoutS = cfg.controller.gym_recovery_timeout_s;
  st.waitingForGymSince = new Date().toISOString();
  ctx.gymDown = true;
  await syncHolds(ctx);
  setCurrentDetails(`**run** \`${cfg.run.name}\`: waiting for Gym to answer again (since ${st.waitingForGymSince}, up to ${timeoutS} s)`);
  try {
    return await ctx.gymRecovery.discoverGym.executeWithOptions({ summary: `wait for Gym (up to ${timeoutS} s)` }, [
      { runDir: cfg.run.gym_run_dir, requireModel: cfg.rollout_checkpointing.gym.require_model_participant },
    ]);
  } catch (err) {
    if (isCancellation(err)) throw err;
    throw ApplicationFailure.nonRetryable(
      `Gym did not answer within controller.gym_recovery_timeout_s (${timeoutS} s) after a crash: ${describeFailure(err)}`,
      'gym_unavailable',
    );
  } finally {
    st.waitingForGymSince = null;
    ctx.gymDown = false;
    await syncHolds(ctx);
  }
}

/** Retries a pending release or abort until it goes through (a failure of a Gym that is up counts as usual). */
async function settlePending(ctx: RunContext): Promise<void> {
  const { st } = ctx;
  if (!st.pendingRelease && !st.pendingAbort) return;
  for (let i = 0; st.pendingRelease || st.pendingAbort; i++) {
    const o = await retryPending(ctx, (st.pendingRelease ?? st.pendingAbort)!.trigger);
    if (o) await record(ctx, o);
    if (ctx.fatal) throw ctx.fatal;
    if (st.pendingRelease || st.pendingAbort) {
      if (o?.gymUnreachable) st.topology = await waitForGym(ctx);
      else await sleep(Math.min(10_000, 1_000 * 2 ** Math.min(i, 4)));
    }
  }
  // The timer armed for the pending retry is stale now: the next checkpoint is the periodic one, if any.
  armCheckpointTimer(ctx);
}
