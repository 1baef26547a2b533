// The run's rollout shards (workflows/rolloutShard.ts): how many, which one a prompt group's
// attempts go to, starting them, handing them attempts, closing them at the run's end.
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import { CancellationScope, ParentClosePolicy, getExternalWorkflowHandle, isCancellation, startChild } from '@temporalio/workflow';
import type { RunConfig } from '../../protocol/run-config.js';
import { closeShard, startAttempts, type AttemptStarts } from '../messages.js';
import { rolloutShard, shardWorkflowId } from '../rolloutShard.js';
import type { RunContext } from './context.js';

/** The run's signal budget for reports (signals a second from all shards together). */
const REPORT_SIGNALS_PER_S = 20;

/** Shards for the configured window: each carries about `rollouts_per_shard` attempts in flight. */
export function shardCount(cfg: RunConfig): number {
  const window = cfg.async_rl.max_in_flight_groups * cfg.grpo.num_generations_per_prompt;
  return Math.max(1, Math.ceil(window / cfg.controller.rollouts_per_shard));
}

/** The shard of a prompt group (every attempt of a group goes to the same one): FNV-1a of its ID. */
export function shardOf(groupId: string, shards: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < groupId.length; i++) {
    h ^= groupId.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % shards;
}

/** Least time between two report batches of one shard: all of them together stay within the budget. */
export function flushIntervalMs(shards: number): number {
  return Math.max(1_000, Math.ceil((shards * 1_000) / REPORT_SIGNALS_PER_S));
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
      args: [
        {
          run: cfg.run.name,
          runWorkflowId: ctx.runId,
          shard,
          attempts: {
            controlTaskQueue: cfg.run.task_queue,
            runTaskQueue: cfg.run.rollout_task_queue,
            retireTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
            runHeartbeatTimeoutS: cfg.controller.run_heartbeat_timeout_s,
            scheduleToStartTimeoutS: cfg.controller.schedule_to_start_timeout_s,
          },
          taskQueue: cfg.run.task_queue,
          flushIntervalMs: flushIntervalMs(st.shards),
          maxHistoryEvents: cfg.controller.max_history_events,
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
  await Promise.all(Array.from({ length: st.shards }, (_, k) => startShard(ctx, k)));
}

/** Hands a shard attempts to start; a shard that is gone (it failed) is started again once. */
export async function sendStarts(ctx: RunContext, shard: number, starts: AttemptStarts): Promise<void> {
  const id = shardWorkflowId(ctx.cfg.run.name, shard);
  try {
    await getExternalWorkflowHandle(id).signal(startAttempts, starts);
  } catch (err) {
    if (isCancellation(err)) throw err;
    await startShard(ctx, shard);
    await getExternalWorkflowHandle(id).signal(startAttempts, starts);
  }
}

/** Tells every shard the run ends (also when it fails or is cancelled). */
export async function closeShards(ctx: RunContext): Promise<void> {
  const { st, cfg } = ctx;
  await CancellationScope.nonCancellable(() =>
    Promise.all(
      Array.from({ length: st.shards }, (_, k) =>
        getExternalWorkflowHandle(shardWorkflowId(cfg.run.name, k))
          .signal(closeShard)
          .catch(() => undefined),
      ),
    ),
  );
}
