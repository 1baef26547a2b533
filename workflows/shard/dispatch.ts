// A shard's dispatch: the attempts its ledger has reserved (new groups, live-failure retries,
// recoveries) started as rollout attempt workflows, in batches by an activity (not as children:
// activities/attempt-starts.ts says why), while the run holds no admission; and `forget` of the
// rollouts finished for good.
import { ApplicationFailure, log } from '@temporalio/workflow';
import type { AttemptStart } from '../../activities/attempt-starts.js';
import type { GymTopology } from '../../protocol/controller.js';
import { captureKey } from '../../protocol/episode-id.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import { gymBusy } from '../messages.js';
import { rolloutsDispatched } from '../metrics.js';
import { rolloutWorkflowId, type RolloutAttemptInput } from '../rolloutAttempt.js';
import type { ShardContext } from './context.js';
import { admissionOpen } from './state.js';

/** Attempt starts per workflow task: each task's commands stay small; the main loop comes straight back. */
const MAX_STARTS_PER_TASK = 250;
/** One start activity's input stays well under Temporal's payload limit (tasks may be inline). */
const MAX_BATCH_CHARS = 192 * 1024;
/** Rollouts forgotten per call once this many are queued (all of them when the shard closes). */
const FORGET_BATCH = 64;

/** Starts the reserved attempts while admission is open (undefined: nothing to start, see rolloutShard.ts). */
export function dispatch(ctx: ShardContext): Promise<void> | undefined {
  const { st } = ctx;
  if (!admissionOpen(st) || !st.topology) return undefined;
  const reserved = L.reservedAttempts(st.ledger);
  const todo = reserved.slice(0, MAX_STARTS_PER_TASK);
  if (todo.length === 0) return undefined;
  if (reserved.length > todo.length) ctx.wake();
  return startAttempts(ctx, st.topology, todo);
}

async function startAttempts(ctx: ShardContext, topology: GymTopology, todo: ReturnType<typeof L.reservedAttempts>): Promise<void> {
  const { st, input } = ctx;
  // Attempts need only the participants (to retire their attempt), not every endpoint.
  const attemptTopology: GymTopology = { members: topology.members, servers: {}, fingerprint: topology.fingerprint, instances: {} };
  const starts: AttemptStart[] = [];
  for (const { group, sibling, attempt } of todo) {
    const episode = L.episodeOfAttempt(sibling, attempt);
    const key = captureKey(episode);
    const env = topology.servers[group.environment];
    if (!env) throw ApplicationFailure.nonRetryable(`no environment server '${group.environment}' in the Gym deployment`, 'invariant_error');
    L.markDispatched(group, sibling, group.environment);
    const workflowId = rolloutWorkflowId(input.run, episode);
    st.inFlight[key] = { episode, groupId: group.group_id, environment: group.environment, workflowId, stopSignalled: false };
    if (input.rolloutTimeoutS !== null) D.addDeadline(st.deadlines, key, input.rolloutTimeoutS * 1000);
    const args: RolloutAttemptInput = {
      run: input.run,
      reportTo: ctx.selfId,
      episode,
      environment: group.environment,
      environmentUrl: env.url,
      ...(topology.instances?.[group.environment] ? { expectedInstance: topology.instances[group.environment] } : {}),
      ...(group.task_ref
        ? { taskRef: { ...group.task_ref, sibling: sibling.generation_index, group_attempt: group.cohort_attempt ?? 0 } }
        : { task: group.tasks[sibling.generation_index] }),
      topology: attemptTopology,
      ...input.attempts,
    };
    starts.push({
      workflowId,
      summary: `rollout ${key} (${group.task_source}) of run ${input.run}`,
      details: `group \`${group.group_id}\`, sibling ${sibling.generation_index}, Gym attempt ${attempt.gym_attempt}${attempt.continued ? ' (continued from a saved turn)' : ''}`,
      continued: attempt.continued === true,
      input: args,
    });
  }
  // Beside their `/run` activity, on the rollout task queue (workflows/attempt-index.ts).
  const taskQueue = input.attempts.runTaskQueue;
  await Promise.all(
    batchesBySize(starts, MAX_BATCH_CHARS).map((batch) =>
      ctx.starts.startRolloutAttempts.executeWithOptions({ summary: `start ${batch.length} rollout attempts` }, [{ run: input.run, taskQueue, starts: batch }]),
    ),
  );
  rolloutsDispatched(todo.length);
}

/** `items` in order, cut into batches of at most `maxChars` characters of JSON each (an item larger than that alone). */
export function batchesBySize<T>(items: readonly T[], maxChars: number): T[][] {
  const out: T[][] = [];
  let batch: T[] = [];
  let chars = 0;
  for (const item of items) {
    const size = JSON.stringify(item).length;
    if (batch.length > 0 && chars + size > maxChars) {
      out.push(batch);
      batch = [];
      chars = 0;
    }
    batch.push(item);
    chars += size;
  }
  if (batch.length > 0) out.push(batch);
  return out;
}

/** Forgets the rollouts finished for good in Gym, in batches (`force`: whatever is queued; undefined: nothing to forget now). */
export function forgetFinished(ctx: ShardContext, force: boolean): Promise<void> | undefined {
  const { st } = ctx;
  if (!st.topology || st.forgetQueue.length === 0 || gymBusy(st.holds)) return undefined;
  if (!force && st.forgetQueue.length < FORGET_BATCH) return undefined;
  return forgetBatch(ctx, st.topology);
}

async function forgetBatch(ctx: ShardContext, topology: GymTopology): Promise<void> {
  const { st, input } = ctx;
  const batch = st.forgetQueue.slice(0, 1000);
  try {
    await ctx.control.gymForget.executeWithOptions({ summary: `forget ${batch.length} rollouts` }, [
      { topology, timeoutS: input.gymTimeoutS, rolloutIds: batch },
    ]);
    st.forgetQueue = st.forgetQueue.slice(batch.length);
  } catch (err) {
    // Kept for the next pass (e.g. a checkpoint opened meanwhile, or retire_incomplete).
    log.warn('forget failed; will retry', { error: String(err) });
  }
}

/** Forgets every queued rollout (the run's end): a batch that does not go through fails the request. */
export async function forgetAll(ctx: ShardContext): Promise<void> {
  for (let left = ctx.st.forgetQueue.length; left > 0; left = ctx.st.forgetQueue.length) {
    await forgetFinished(ctx, true);
    if (ctx.st.forgetQueue.length >= left) throw new Error(`${left} finished rollouts could not be forgotten in Gym`);
  }
}
