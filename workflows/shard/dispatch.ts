// A shard's dispatch: the attempts its ledger has reserved (new groups, live-failure retries,
// recoveries) started as rollout attempt workflows, its own children, while the run holds no
// admission; and `forget` of the rollouts finished for good.
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import { ApplicationFailure, ParentClosePolicy, WorkflowIdReusePolicy, log, startChild } from '@temporalio/workflow';
import type { GymTopology } from '../../protocol/controller.js';
import { captureKey } from '../../protocol/episode-id.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import { gymBusy } from '../messages.js';
import { rolloutsDispatched } from '../metrics.js';
import { rolloutAttempt, rolloutWorkflowId, type RolloutAttemptInput } from '../rolloutAttempt.js';
import { ROLLOUT_CONTINUED, ROLLOUT_STATUS, RUN_NAME } from '../search-attributes.js';
import type { ShardContext } from './context.js';
import { admissionOpen } from './state.js';

/** Child starts per workflow task: each task's commands stay small; the main loop comes straight back. */
const MAX_STARTS_PER_TASK = 250;
/** Rollouts forgotten per call once this many are queued (all of them when the shard closes). */
const FORGET_BATCH = 64;

export async function dispatch(ctx: ShardContext): Promise<void> {
  const { st, input } = ctx;
  if (!admissionOpen(st) || !st.topology) return;
  const reserved = L.reservedAttempts(st.ledger);
  const todo = reserved.slice(0, MAX_STARTS_PER_TASK);
  if (reserved.length > todo.length) ctx.wake();
  const topology = st.topology;
  // Children need only the participants (to retire their attempt), not every endpoint.
  const childTopology: GymTopology = { members: topology.members, servers: {}, fingerprint: topology.fingerprint, instances: {} };
  const starts: Array<Promise<void>> = [];
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
      topology: childTopology,
      ...input.attempts,
    };
    starts.push(
      startChild(rolloutAttempt, {
        workflowId,
        // Beside its `/run` activity, on the rollout task queue (workflows/attempt-index.ts).
        taskQueue: input.attempts.runTaskQueue,
        parentClosePolicy: ParentClosePolicy.ABANDON,
        // An attempt runs once: a start repeated after it ended must not run it again.
        workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
        staticSummary: `rollout ${key} (${group.task_source}) of run ${input.run}`,
        staticDetails: `group \`${group.group_id}\`, sibling ${sibling.generation_index}, Gym attempt ${attempt.gym_attempt}${attempt.continued ? ' (continued from a saved turn)' : ''}`,
        typedSearchAttributes: [
          { key: RUN_NAME, value: input.run },
          { key: ROLLOUT_STATUS, value: 'running' },
          { key: ROLLOUT_CONTINUED, value: attempt.continued === true },
        ],
        args: [args],
      }).then(
        () => undefined,
        (err: unknown) => {
          // Already started (a start recorded before a continue-as-new): it reports here by signal.
          if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
        },
      ),
    );
  }
  await Promise.all(starts);
  rolloutsDispatched(todo.length);
}

/** Forgets the rollouts finished for good in Gym, in batches (`force`: whatever is queued). */
export async function forgetFinished(ctx: ShardContext, force: boolean): Promise<void> {
  const { st, input } = ctx;
  if (!st.topology || st.forgetQueue.length === 0 || gymBusy(st.holds)) return;
  if (!force && st.forgetQueue.length < FORGET_BATCH) return;
  const batch = st.forgetQueue.slice(0, 1000);
  try {
    await ctx.control.gymForget.executeWithOptions({ summary: `forget ${batch.length} rollouts` }, [
      { topology: st.topology, timeoutS: input.gymTimeoutS, rolloutIds: batch },
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
