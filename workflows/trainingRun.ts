// The training run (workflow ID = run name): the recovery ledger, the admission gates, the
// rollout deadlines, dispatch, the checkpoint pump, training steps and Gym recovery, each in its
// own module under run/; this file holds the handlers and the main loop. Its event history is the
// controller's durable memory. Checkpoint attempts are its children; rollout attempts are children
// of its rollout shards (run/shards.ts), which relay their reports in batches.
import { ContinueAsNew, allHandlersFinished, condition, continueAsNew, log, setCurrentDetails, setHandler, upsertMemo, workflowInfo } from '@temporalio/workflow';
import {
  checkpointCommitted,
  checkpointNow,
  checkpointPrepared,
  pauseRun,
  resumeRun,
  rolloutsFinished,
  runStatus,
  stopRun,
  type RunStatus,
} from './messages.js';
import { armCheckpointTimer, checkpointDue, startCheckpoint } from './run/checkpoints.js';
import { MAX_CARRIED_STATE_BYTES, packRunState, unpackRunState } from './run/codec.js';
import { coldStart, setupLevels } from './run/cold-start.js';
import { startDeadlineClock } from './run/deadline-clock.js';
import { RunContext } from './run/context.js';
import { dispatch, forgetFinished } from './run/dispatch.js';
import { settleLiveFailures } from './run/live-failures.js';
import { recoverGym } from './run/recovery.js';
import { closeShards } from './run/shards.js';
import { signalExpired, stopAbandoned, takeReports } from './run/stops.js';
import { initialState, summaryOf, type RunSummary, type TrainingRunInput } from './run/state.js';
import { trainReadyGroups } from './run/training.js';

export type { InFlight, RecoveryRecord, RestoredFrom, RunState, RunSummary, TrainingRunInput } from './run/state.js';

export async function trainingRun(input: TrainingRunInput): Promise<RunSummary> {
  const cfg = input.config;
  const st = input.state === undefined ? initialState(cfg) : unpackRunState(input.state, cfg.run.name);
  const ctx = new RunContext(cfg, st);
  /** History length before which continue-as-new is not tried again (the state was too large). */
  let carryRetryAt = 0;

  setHandler(rolloutsFinished, (rs) => {
    st.reports.push(...rs);
    ctx.wake();
  });
  setHandler(checkpointCommitted, (c) => {
    ctx.cutRequest = c;
    ctx.wake();
  });
  setHandler(checkpointPrepared, (c) => {
    ctx.earlyCutRequest = c;
    ctx.wake();
  });
  setHandler(pauseRun, () => {
    st.paused = true;
    ctx.wake();
  });
  setHandler(resumeRun, () => {
    st.paused = false;
    ctx.wake();
  });
  setHandler(stopRun, () => {
    st.stopRequested = true;
    ctx.wake();
  });
  setHandler(runStatus, (): RunStatus => ctx.status());
  setHandler(checkpointNow, async () => {
    const ticket = ++ctx.manualRequested;
    ctx.wake();
    await condition(() => ctx.manualOutcomes[ticket] !== undefined);
    const o = ctx.manualOutcomes[ticket]!;
    delete ctx.manualOutcomes[ticket];
    return o;
  });

  try {
    if (!st.topology) {
      st.topology = await ctx.control.discoverGym({ runDir: cfg.run.gym_run_dir, requireModel: cfg.rollout_checkpointing.gym.require_model_participant });
    }
    if (!st.levels) setupLevels(ctx, st.topology);
    let coldRecoveryPending = false;
    if (!input.state && cfg.rollout_checkpointing.restore_mode === 'latest') coldRecoveryPending = await coldStart(ctx, st.topology);
    await upsertMemo({ run: cfg.run.name, steps: st.steps });
    armCheckpointTimer(ctx);
    startDeadlineClock(ctx);
    const inFlight = (): number => Object.keys(st.inFlight).length;
    const done = (): boolean => (st.steps >= cfg.grpo.max_num_steps || st.stopRequested) && inFlight() === 0 && !ctx.checkpointRunning;

    for (;;) {
      if (ctx.fatal) throw ctx.fatal;
      ctx.changed = false;
      takeReports(ctx);
      await settleLiveFailures(ctx);
      await trainReadyGroups(ctx);
      if (st.recoveryNeeded && !ctx.checkpointRunning) await recoverGym(ctx, coldRecoveryPending);
      coldRecoveryPending = false;
      if (done() && !st.pendingRelease && !st.pendingAbort && ctx.manualRequested === ctx.manualServed) break;
      if (checkpointDue(ctx)) startCheckpoint(ctx);
      await signalExpired(ctx);
      await stopAbandoned(ctx);
      if (st.steps < cfg.grpo.max_num_steps) await dispatch(ctx);
      await forgetFinished(ctx, false);
      setCurrentDetails(
        `**run** \`${cfg.run.name}\` — ${ctx.phase()}\n\nstep ${st.steps}/${cfg.grpo.max_num_steps}, ${inFlight()} rollouts in flight, ` +
          `${st.completedRollouts} completed, last snapshot: ${st.lastSnapshot ?? 'none'}`,
      );
      const info = workflowInfo();
      if (!ctx.checkpointRunning && (info.historyLength > cfg.controller.max_history_events || info.continueAsNewSuggested)) {
        await condition(allHandlersFinished);
        await ctx.retention;
        if (!ctx.checkpointRunning && ctx.manualRequested === ctx.manualServed && info.historyLength >= carryRetryAt) {
          const state = packRunState({ ...st, continuedAsNew: st.continuedAsNew + 1 }, cfg.run.name);
          const bytes = JSON.stringify(state).length;
          if (bytes <= MAX_CARRIED_STATE_BYTES) await continueAsNew<typeof trainingRun>({ config: cfg, state });
          // Over the payload limit the continue-as-new would fail its workflow task forever: keep
          // running on this history (hard limits: 51,200 events / 50 MiB), try again later.
          carryRetryAt = info.historyLength + 1_000;
          log.error('run state too large to continue as new; continuing on the current history', { bytes, limit: MAX_CARRIED_STATE_BYTES, inFlight: inFlight() });
        }
      }
      if (!ctx.changed) await condition(() => ctx.changed || ctx.fatal !== undefined);
    }

    await forgetFinished(ctx, true);
    await closeShards(ctx);
    await condition(allHandlersFinished);
    await ctx.retention;
    return summaryOf(cfg, st);
  } catch (err) {
    // Not at a continue-as-new: the shards live on into the next execution.
    if (!(err instanceof ContinueAsNew)) await closeShards(ctx);
    throw err;
  }
}
