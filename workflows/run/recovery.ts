// Recovery after a Gym crash, with the controller alive (design.md "Recovery"): wait for Gym, let
// every attempt in flight report, restore the latest published snapshot all-or-nothing into the
// fresh processes (recovery-plan.ts decides the scope and what each sibling becomes), retire the
// dead attempts. Sealed work is never redone: it is in the run's history.
import { ApplicationFailure, condition, isCancellation, log, setCurrentDetails, sleep, uuid4 } from '@temporalio/workflow';
import type { GymTopology } from '../../protocol/controller.js';
import * as D from '../deadlines.js';
import { describeFailure } from '../failures.js';
import * as L from '../ledger.js';
import { planRecovery, restoredRollouts, settleRecovery } from '../recovery-plan.js';
import { record, retryPending } from './checkpoints.js';
import { settleLiveFailures } from './live-failures.js';
import type { RunContext } from './context.js';
import { signalExpired, stopAbandoned, takeReports } from './stops.js';
import { MAX_KEPT_OUTCOMES, type RecoveryRecord } from './state.js';

const RECOVERY_HOLDER = 'gym-recovery';

/** `cold`: the first recovery of a run that took over another's checkpoint directory. */
export async function recoverGym(ctx: RunContext, cold = false): Promise<void> {
  const { st, cfg } = ctx;
  // While Gym is down its attempts cannot report: their clocks stop, or a crash would spend them.
  D.hold(st.deadlines, RECOVERY_HOLDER);
  ctx.recovering = true;
  let held = true;
  const rec: RecoveryRecord = { at: new Date().toISOString(), restoreId: null, snapshotDir: st.lastSnapshot, continued: [], restarted: [] };
  try {
    // Failures not yet charged were this crash's: their siblings start over uncharged.
    await settleLiveFailures(ctx);
    // Gym first: attempts in flight report only once their processes answer again.
    st.topology = await waitForGym(ctx);
    // Gym is up: the failures before this were its crash, not a Gym that does not recover.
    st.consecutiveFailures = 0;
    // A checkpoint left prepared (its abort or release pending) holds the surviving processes'
    // episodes at their boundaries: release it first, or they never report.
    await settlePending(ctx);
    // Gym is up: the attempts still in flight on surviving processes run as usual until they
    // report, deadlines included (a hung one is stopped at its deadline instead of holding this).
    D.release(st.deadlines, RECOVERY_HOLDER);
    held = false;
    for (;;) {
      takeReports(ctx);
      await stopAbandoned(ctx);
      await signalExpired(ctx);
      if (Object.keys(st.inFlight).length === 0) break;
      await condition(() => st.reports.length > 0 || (ctx.expiryDue && D.isRunning(st.deadlines)));
    }
    // Again: a second crash may have come while the attempts reported.
    const topology = await waitForGym(ctx);
    st.topology = topology;
    const plan = planRecovery(st.ledger, { lastSnapshot: st.lastSnapshot, lastSnapshotScope: st.lastSnapshotScope });
    let restored = new Set<string>();
    let restoreFailed = false;
    if (plan.scope.length > 0 && st.lastSnapshot) {
      const restoreId = `restore-${uuid4().replace(/-/g, '')}`;
      rec.restoreId = restoreId;
      const timeoutS = cfg.rollout_checkpointing.gym.prepare_timeout_s;
      try {
        const r = await ctx.control.gymRestore.executeWithOptions({ summary: `restore ${plan.scope.length} episodes from ${st.lastSnapshot}` }, [
          { topology, restoreId, timeoutS, checkpointDir: st.lastSnapshot, scope: plan.scope },
        ]);
        await ctx.control.gymResume({ topology, checkpointId: restoreId, timeoutS });
        restored = restoredRollouts(plan, r.restored);
      } catch (err) {
        // All or nothing: the coordination client retired the replacements N+1 everywhere.
        restoreFailed = true;
        rec.error = describeFailure(err);
        log.warn('restore after the Gym crash failed; unfinished work starts over', { error: rec.error });
      }
    }
    const settled = settleRecovery(st.ledger, plan, { restored, restoreFailed, cold });
    rec.continued = settled.continued;
    rec.restarted = settled.restarted;
    st.completedRollouts -= settled.superseded;
    // A harness of a dead attempt that outlived the crash must not write into the rerun.
    if (settled.retire.length > 0) {
      await ctx.control.gymRetire({ topology, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s, episodes: settled.retire }).catch((err) => {
        log.warn('retiring the dead attempts failed (fresh processes hold nothing of them)', { error: String(err) });
      });
      st.forgetQueue.push(...settled.retire.map((e) => e.rollout_id).filter((r) => !L.findSibling(st.ledger, r)));
    }
    log.info('recovered from a Gym crash', { continued: rec.continued.length, restarted: rec.restarted.length });
  } finally {
    st.recoveries = [...st.recoveries, rec].slice(-MAX_KEPT_OUTCOMES);
    st.recoveryNeeded = false;
    ctx.recovering = false;
    if (held) D.release(st.deadlines, RECOVERY_HOLDER);
    ctx.wake();
  }
}

/**
 * Discovery until every Gym participant answers: after a crash the run's normal state, not a
 * failure. Retried with backoff up to `controller.gym_recovery_timeout_s`; meanwhile the status
 * phase is `waiting_for_gym` and the UI shows the pending discovery with its attempts.
 */
async function waitForGym(ctx: RunContext): Promise<GymTopology> {
  const { st, cfg } = ctx;
  const timeoutS = cfg.controller.gym_recovery_timeout_s;
  st.waitingForGymSince = new Date().toISOString();
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
  }
}

/** Retries a pending release or abort until it goes through (a failure of a Gym that is up counts as usual). */
async function settlePending(ctx: RunContext): Promise<void> {
  const { st } = ctx;
  for (let i = 0; st.pendingRelease || st.pendingAbort; i++) {
    const o = await retryPending(ctx, (st.pendingRelease ?? st.pendingAbort)!.trigger);
    if (o) await record(ctx, o);
    if (ctx.fatal) throw ctx.fatal;
    if (st.pendingRelease || st.pendingAbort) {
      if (o?.gymUnreachable) st.topology = await waitForGym(ctx);
      else await sleep(Math.min(10_000, 1_000 * 2 ** i));
    }
  }
}
