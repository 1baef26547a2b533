// The run's rollout shards (workflows/rolloutShard.ts): how many, starting them, assigning them
// prompt groups, telling them the holds, closing them at the run's end.
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import { CancellationScope, ParentClosePolicy, getExternalWorkflowHandle, isCancellation, log, startChild } from '@temporalio/workflow';
import type { RunConfig } from '../../protocol/run-config.js';
import { HOLDERS, assignGroups, closeShard, setHolds, type AssignGroups, type Holds } from '../messages.js';
import { rolloutShard } from '../rolloutShard.js';
import { allShards } from '../shard-asker.js';
import { ofRun } from '../search-attributes.js';
import { shardWorkflowId } from '../shard-id.js';
import type { RunContext } from './context.js';

import { RUN_BEAT_SHARE } from '../../protocol/controller.js';

export { shardOf } from '../../protocol/controller.js';

/**
 * The run's signal budget for reports (signals a second from all shards together). Below the ~20
 * a workflow should take: the shards' answers come on top (at 16,000 a budget of 20, then counted
 * on average only, measured 21.7 a second into the run in its busiest 10 s, docs/performance.md).
 */
const REPORT_SIGNALS_PER_S = 16;

/**
 * A shard continues as new past this many events, or sooner at `controller.max_history_events`.
 * Attempts signal it while it continues as new, and the server then refuses the continue-as-new
 * (unhandled command): the worker evicts the shard and replays its whole history in the next task.
 * A long history made that replay outlast the workflow task timeout on a busy worker, and every
 * retry was longer still: the shard stopped (docs/performance.md, controller-scale at 16,000).
 */
export const SHARD_MAX_HISTORY_EVENTS = 1_000;

export function shardMaxHistoryEvents(cfg: RunConfig): number {
  return Math.min(cfg.controller.max_history_events, SHARD_MAX_HISTORY_EVENTS);
}

/** Shards for the configured window: each carries about `rollouts_per_shard` attempts in flight. */
export function shardCount(cfg: RunConfig): number {
  const window = cfg.async_rl.max_in_flight_groups * cfg.grpo.num_generations_per_prompt;
  return Math.max(1, Math.ceil(window / cfg.controller.rollouts_per_shard));
}

/**
 * The heartbeat timeout of the run's `/run`s: `run_heartbeat_timeout_s`, or longer when the window
 * of `/run`s, each beaten once per `RUN_BEAT_SHARE` of it, would pass `run_heartbeats_per_s`.
 */
export function runHeartbeatTimeoutS(cfg: RunConfig): number {
  const window = cfg.async_rl.max_in_flight_groups * cfg.grpo.num_generations_per_prompt;
  return Math.max(cfg.controller.run_heartbeat_timeout_s, Math.ceil(window / (RUN_BEAT_SHARE * cfg.controller.run_heartbeats_per_s)));
}

/** The stretch over which a signal rate counts as sustained (as the benchmarks measure it). */
const RATE_WINDOW_MS = 10_000;

/**
 * Least time between two reports of one shard: all of them together stay within the budget in
 * any stretch of `RATE_WINDOW_MS`, where a shard fits ⌊window ÷ interval⌋ + 1 reports (one at each
 * end). Past 160 shards one report each per stretch is already over it: then only on average.
 */
export function flushIntervalMs(shards: number): number {
  const perShard = Math.floor((REPORT_SIGNALS_PER_S * RATE_WINDOW_MS) / 1_000 / shards);
  if (perShard === 0) return Math.ceil((shards * 1_000) / REPORT_SIGNALS_PER_S);
  return Math.max(1_000, Math.floor(RATE_WINDOW_MS / perShard) + 1);
}

async function startShard(ctx: RunContext, shard: number): Promise<void> {
  const { cfg, st } = ctx;
  try {
    await startChild(rolloutShard, {
      workflowId: shardWorkflowId(cfg.run.name, shard),
      taskQueue: cfg.run.task_queue,
      // Lives across the run's continue-as-new; the run closes it at its end.
      parentClosePolicy: ParentClosePolicy.ABANDON,
      staticSummary: `rollout shard ${shard + 1}/${st.shards} of run ${cfg.run.name}`,
      typedSearchAttributes: ofRun(cfg.run.name),
      args: [
        {
          run: cfg.run.name,
          runWorkflowId: ctx.runId,
          shard,
          shards: st.shards,
          attempts: {
            controlTaskQueue: cfg.run.task_queue,
            runTaskQueue: cfg.run.rollout_task_queue,
            retireTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
            runHeartbeatTimeoutS: runHeartbeatTimeoutS(cfg),
            scheduleToStartTimeoutS: cfg.controller.schedule_to_start_timeout_s,
          },
          flushIntervalMs: flushIntervalMs(st.shards),
          maxHistoryEvents: shardMaxHistoryEvents(cfg),
          maxAttemptsPerSibling: cfg.async_rl.max_attempts_per_sibling,
          rolloutTimeoutS: cfg.async_rl.rollout_timeout_s,
          gymRunDir: cfg.run.gym_run_dir,
          requireModel: cfg.rollout_checkpointing.gym.require_model_participant,
          gymTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
          holds: st.holds,
          ...(st.loadFrom ? { load: st.loadFrom } : {}),
        },
      ],
    });
  } catch (err) {
    // Running already: started by this run before a continue-as-new (or by an earlier run of the
    // same name that ended without closing it): it reports to whichever run holds the name now.
    if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
  }
}

/** Starts the run's shards once (their number is fixed for the run's life). */
export async function ensureShards(ctx: RunContext): Promise<void> {
  const { st } = ctx;
  if (st.shards > 0) return;
  st.shards = shardCount(ctx.cfg);
  await Promise.all(allShards(st.shards).map((k) => startShard(ctx, k)));
}

/** Signals a shard; one that is gone (it failed) is started again once. */
async function toShard(ctx: RunContext, shard: number, send: (id: string) => Promise<void>): Promise<void> {
  const id = shardWorkflowId(ctx.cfg.run.name, shard);
  try {
    await send(id);
  } catch (err) {
    if (isCancellation(err)) throw err;
    await startShard(ctx, shard);
    await send(id);
  }
}

/** Hands a shard prompt groups to own. */
export async function sendGroups(ctx: RunContext, shard: number, groups: AssignGroups): Promise<void> {
  ctx.st.assigned[shard] = (ctx.st.assigned[shard] ?? 0) + groups.groups.length;
  await toShard(ctx, shard, (id) => getExternalWorkflowHandle(id).signal(assignGroups, groups));
}

/** Who holds admission and the deadline clocks now, from the run's gates and flags. */
export function desiredHolds(ctx: RunContext): Omit<Holds, 'seq'> {
  const { st } = ctx;
  const admission: string[] = [];
  const deadlines: string[] = [];
  for (const [closed, holder] of [
    [st.gates.gymCheckpoint, HOLDERS.checkpoint],
    [st.gates.weightSync, HOLDERS.weightSync],
  ] as const) {
    if (!closed) continue;
    admission.push(holder);
    deadlines.push(holder);
  }
  // While Gym is down its attempts cannot report: their clocks stop, or a crash would spend them.
  if (st.recoveryNeeded || ctx.recovering) admission.push(HOLDERS.recovery);
  if (ctx.gymDown) deadlines.push(HOLDERS.recovery);
  if (st.paused) admission.push(HOLDERS.paused);
  if (st.stopRequested) admission.push(HOLDERS.stopping);
  const reports = ctx.continuingAsNew ? [HOLDERS.continueAsNew] : [];
  return { admission: admission.sort(), deadlines: deadlines.sort(), reports };
}

/**
 * Tells every shard the holds when they changed, and waits until each has them in its history: a
 * shard dispatches nothing more once the signal is there, so a checkpoint may then ask for its
 * candidates. Sent whole, with a sequence number (messages.ts Holds).
 */
export async function syncHolds(ctx: RunContext): Promise<void> {
  const { st } = ctx;
  const want = desiredHolds(ctx);
  if (JSON.stringify(want) === JSON.stringify({ admission: st.holds.admission, deadlines: st.holds.deadlines, reports: st.holds.reports })) return;
  st.holds = { seq: st.holds.seq + 1, ...want };
  if (st.shards === 0) return;
  const holds = st.holds;
  await Promise.all(allShards(st.shards).map((k) => toShard(ctx, k, (id) => getExternalWorkflowHandle(id).signal(setHolds, holds))));
}

/** The holds with the checkpoint's, for an attempt to deliver with its candidates request (no signal here). */
export function holdsForCheckpoint(ctx: RunContext): void {
  const { st } = ctx;
  st.holds = { seq: st.holds.seq + 1, ...desiredHolds(ctx) };
}

/**
 * At the run's normal end: every shard waits out its attempts and forgets its finished rollouts
 * in Gym before the run returns, so a finished run leaves no retire marks behind. A shard that
 * cannot (Gym gone) is logged, not fatal: the run's work is done.
 */
export async function forgetInShards(ctx: RunContext): Promise<void> {
  const { st, cfg } = ctx;
  if (st.shards === 0) return;
  const answers = await ctx.shardsAsk.ask(
    allShards(st.shards),
    () => ({ kind: 'drain', forget: true }),
    cfg.rollout_checkpointing.gym.prepare_timeout_s * 1000,
  );
  for (const a of answers) if (a.error) log.warn('a shard could not forget its finished rollouts at the run end', { shard: a.shard, error: a.error });
}

/** Tells every shard the run ends (also when it fails or is cancelled). */
export async function closeShards(ctx: RunContext): Promise<void> {
  const { st, cfg } = ctx;
  await CancellationScope.nonCancellable(() =>
    Promise.all(
      allShards(st.shards).map((k) =>
        getExternalWorkflowHandle(shardWorkflowId(cfg.run.name, k))
          .signal(closeShard)
          .catch(() => undefined),
      ),
    ),
  );
}
