// Dispatch: prompt groups reserved from the dataset up to `max_in_flight_groups`, each reserved
// attempt handed to its group's rollout shard, which starts it as a rollout attempt workflow; and
// `forget` of rollouts finished for good.
import { ApplicationFailure, log } from '@temporalio/workflow';
import type { GymTopology } from '../../protocol/controller.js';
import { captureKey } from '../../protocol/episode-id.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import type { AttemptStart } from '../messages.js';
import { rolloutWorkflowId } from '../rolloutAttempt.js';
import type { RunContext } from './context.js';
import { ensureShards, sendStarts, shardOf } from './shards.js';

/** Groups per dataset read: an activity result stays far below Temporal's payload limits. */
const LOAD_BATCH_GROUPS = 64;
/** Attempts handed out per workflow task: each task's commands stay small; the main loop comes straight back. */
const MAX_STARTS_PER_TASK = 250;
/** Rollouts forgotten per call once this many are queued (all of them at the run's end). */
const FORGET_BATCH = 64;

export async function dispatch(ctx: RunContext): Promise<void> {
  const { st, cfg } = ctx;
  if (!ctx.admissionOpen() || !st.topology) return;
  // Keep `max_in_flight_groups` unfinished groups reserved.
  const unfinished = L.unfinishedGroupCount(st.ledger);
  const want = Math.min(cfg.async_rl.max_in_flight_groups - unfinished, ctx.totalGroups - st.ledger.cursor);
  if (want > 0) await reserveGroups(ctx, want);
  if (!ctx.admissionOpen()) return;
  const reserved = L.reservedAttempts(st.ledger);
  const todo = reserved.slice(0, MAX_STARTS_PER_TASK);
  if (reserved.length > todo.length) ctx.wake();
  const topology = st.topology;
  // Children need only the participants (to retire their attempt), not every endpoint.
  const childTopology: GymTopology = { members: topology.members, servers: {}, fingerprint: topology.fingerprint, instances: {} };
  await ensureShards(ctx);
  const byShard = new Map<number, AttemptStart[]>();
  for (const { group, sibling, attempt } of todo) {
    const episode = L.episodeOfAttempt(sibling, attempt);
    const key = captureKey(episode);
    const env = topology.servers[group.environment];
    if (!env) throw ApplicationFailure.nonRetryable(`no environment server '${group.environment}' in the Gym deployment`, 'invariant_error');
    L.markDispatched(group, sibling, group.environment);
    const workflowId = rolloutWorkflowId(cfg.run.name, episode);
    st.inFlight[key] = { episode, groupId: group.group_id, environment: group.environment, workflowId, stopSignalled: false };
    if (cfg.async_rl.rollout_timeout_s !== null) D.addDeadline(st.deadlines, key, cfg.async_rl.rollout_timeout_s * 1000);
    const shard = shardOf(group.group_id, st.shards);
    if (!byShard.has(shard)) byShard.set(shard, []);
    byShard.get(shard)!.push({
      episode,
      environment: group.environment,
      environmentUrl: env.url,
      ...(topology.instances?.[group.environment] ? { expectedInstance: topology.instances[group.environment] } : {}),
      ...(group.task_ref
        ? { taskRef: { ...group.task_ref, sibling: sibling.generation_index, group_attempt: group.cohort_attempt ?? 0 } }
        : { task: group.tasks[sibling.generation_index] }),
      summary: `rollout ${key} (${group.task_source}) of run ${cfg.run.name}`,
      details: `group \`${group.group_id}\`, sibling ${sibling.generation_index}, Gym attempt ${attempt.gym_attempt}${attempt.continued ? ' (continued from a saved turn)' : ''}`,
    });
  }
  await Promise.all([...byShard].map(([shard, attempts]) => sendStarts(ctx, shard, { attempts, topology: childTopology })));
}

/** Reserves up to `want` new prompt groups from the dataset (one bounded read). */
async function reserveGroups(ctx: RunContext, want: number): Promise<void> {
  const { st, cfg } = ctx;
  const loaded = await ctx.storage.loadPromptGroups({
    seed: cfg.run.seed,
    cursor: st.ledger.cursor,
    groups: Math.min(want, LOAD_BATCH_GROUPS),
    groupSize: cfg.grpo.num_generations_per_prompt,
    tasksets: cfg.grpo.tasksets,
  });
  if (loaded.groups.length < want) ctx.wake();
  for (const g of loaded.groups) {
    const environment = cfg.grpo.environments[g.taskset] ?? `${g.taskset}_env`;
    // Run-scoped group ID: two runs on one Gym deployment never share a verification cohort.
    const groupId = `${cfg.run.name}.${g.group_id}`;
    L.reserveGroup(st.ledger, {
      group_id: groupId,
      prompt_id: g.prompt_id,
      task_source: g.taskset,
      environment,
      recovery_granularity: st.levels?.[environment]?.recovery_granularity ?? 'sibling',
      restore_level: st.levels?.[environment]?.restore_level ?? cfg.rollout_recovery.target_level,
      target_step: Math.floor(st.ledger.cursor / cfg.grpo.num_prompts_per_step),
      tasks: [],
      size: g.size,
      task_ref: { group_id: groupId, seed: cfg.run.seed, prompt_index: g.prompt_index, group_size: g.size, tasksets: [...cfg.grpo.tasksets] },
    });
    st.ledger.cursor += 1;
  }
}

/** Forgets the rollouts finished for good in Gym, in batches (`force`: whatever is queued). */
export async function forgetFinished(ctx: RunContext, force: boolean): Promise<void> {
  const { st, cfg } = ctx;
  if (!st.topology || st.forgetQueue.length === 0 || ctx.checkpointRunning || st.gates.gymCheckpoint) return;
  if (!force && st.forgetQueue.length < FORGET_BATCH) return;
  const batch = st.forgetQueue.slice(0, 1000);
  try {
    await ctx.control.gymForget.executeWithOptions({ summary: `forget ${batch.length} rollouts` }, [
      { topology: st.topology, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s, rolloutIds: batch },
    ]);
    st.forgetQueue = st.forgetQueue.slice(batch.length);
  } catch (err) {
    // Kept for the next pass (e.g. a checkpoint opened meanwhile, or retire_incomplete).
    log.warn('forget failed; will retry', { error: String(err) });
  }
}
