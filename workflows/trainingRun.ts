// The training run (workflow ID = run name): the dataset cursor, the steps and the trainer, the
// admission gates and the holds it sets in its rollout shards, the checkpoint pump and Gym
// recovery, each in its own module under run/; this file holds the handlers and the main loop.
// The prompt groups in flight, their attempts and results are the shards' (rolloutShard.ts): the
// run carries nothing per rollout. Its event history, with its shards', is the controller's durable
// memory.
import { ContinueAsNew, allHandlersFinished, condition, setCurrentDetails, setHandler } from '@temporalio/workflow';
import { checkpointNow, pauseRun, resumeRun, runStatus, shardReport, stopRun, type RunStatus } from './messages.js';
import { continueAsNewDue, continueAsNewQuietly } from './run/carry.js';
import { armCheckpointTimer, checkpointDue, startCheckpoint } from './run/checkpoints.js';
import { coldStart, setupLevels } from './run/cold-start.js';
import { RunContext } from './run/context.js';
import { dispatch } from './run/dispatch.js';
import { recoverGym } from './run/recovery.js';
import { closeShards, forgetInShards, syncHolds } from './run/shards.js';
import { applyShardReports, initialState, summaryOf, totalInFlight, type RunSummary, type TrainingRunInput } from './run/state.js';
import { trainReadyGroups } from './run/training.js';

export type { RecoveryRecord, RestoredFrom, RunState, RunSummary, TrainingRunInput } from './run/state.js';

export async function trainingRun(input: TrainingRunInput): Promise<RunSummary> {
  const cfg = input.config;
  const st = input.state ?? initialState();
  const ctx = new RunContext(cfg, st);

  setHandler(shardReport, (r) => {
    st.reports.push(r);
    ctx.reportsReceived += 1;
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
    ctx.showInList();
    armCheckpointTimer(ctx);
    const done = (): boolean => (st.steps >= cfg.grpo.max_num_steps || st.stopRequested) && totalInFlight(st) === 0 && !ctx.checkpointRunning;

    for (;;) {
      if (ctx.fatal) throw ctx.fatal;
      ctx.changed = false;
      applyShardReports(st);
      await trainReadyGroups(ctx);
      if (st.recoveryNeeded && !ctx.checkpointRunning) await recoverGym(ctx, coldRecoveryPending);
      coldRecoveryPending = false;
      if (done() && !st.pendingRelease && !st.pendingAbort && ctx.manualRequested === ctx.manualServed) break;
      if (checkpointDue(ctx)) startCheckpoint(ctx);
      // Pause, stop and a noticed crash close admission in the shards too.
      if (!ctx.checkpointRunning) await syncHolds(ctx);
      if (st.steps < cfg.grpo.max_num_steps) await dispatch(ctx);
      ctx.showInList();
      setCurrentDetails(
        `**run** \`${cfg.run.name}\` — ${ctx.phase()}\n\nstep ${st.steps}/${cfg.grpo.max_num_steps}, ${totalInFlight(st)} rollouts in flight in ${st.shards} shards, ` +
          `${st.completedRollouts} completed, last snapshot: ${st.lastSnapshot ?? 'none'}`,
      );
      if (continueAsNewDue(ctx)) await continueAsNewQuietly(ctx);
      if (!ctx.changed) await condition(() => ctx.changed || ctx.fatal !== undefined);
    }

    await forgetInShards(ctx);
    await closeShards(ctx);
    await condition(allHandlersFinished);
    await ctx.retention;
    ctx.showInList('finished');
    return summaryOf(cfg, st);
  } catch (err) {
    // Not at a continue-as-new: the shards live on into the next execution.
    if (!(err instanceof ContinueAsNew)) {
      ctx.showInList('failed');
      await closeShards(ctx);
    }
    throw err;
  }
}
