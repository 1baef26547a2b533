// Starts a shard's rollout attempt workflows (workflows/shard/dispatch.ts), a batch per call.
// Not child workflows: a child costs its parent two more history writes (its start and its end,
// each recorded in the parent by the server) and the parent's workflow a start command and two
// resolutions per attempt; the attempt reports to its shard by signal either way, since the shard
// continues as new under running attempts. Started here, an attempt costs what a workflow a client
// starts costs (docs/controller.md "Dispatch", docs/performance.md "Controller overhead").
// Idempotent: an ID is never reused (REJECT_DUPLICATE), so a start repeated after a retry, or
// after the attempt already ended, is refused as already started and counted as started.
import { Context } from '@temporalio/activity';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import { activityClient } from './traced-client.js';
import type { RolloutAttemptInput } from '../workflows/rolloutAttempt.js';
import { ROLLOUT_CONTINUED, ROLLOUT_STATUS, RUN_NAME } from '../workflows/search-attributes.js';

export interface AttemptStart {
  workflowId: string;
  /** The attempt's summary and details in the Temporal UI. */
  summary: string;
  details: string;
  /** It continues an episode from a saved turn (search attribute `RolloutContinued`). */
  continued: boolean;
  input: RolloutAttemptInput;
}

export interface StartRolloutAttemptsInput {
  run: string;
  /** The rollout task queue (the attempts run beside their `/run` activity). */
  taskQueue: string;
  starts: AttemptStart[];
}

export interface StartRolloutAttemptsOutcome {
  started: number;
  /** Started by an earlier try of this activity (or ended already): nothing new. */
  alreadyStarted: number;
}

/** Start calls in flight at once, per activity. */
const START_WINDOW = 16;

export function createAttemptStartActivities() {
  return {
    async startRolloutAttempts(input: StartRolloutAttemptsInput): Promise<StartRolloutAttemptsOutcome> {
      const ctx = Context.current();
      // The attempt's trace links to the start's span, a child of this activity's.
      const client = activityClient(ctx);
      const out: StartRolloutAttemptsOutcome = { started: 0, alreadyStarted: 0 };
      let next = 0;
      const lane = async (): Promise<void> => {
        while (next < input.starts.length) {
          const s = input.starts[next++]!;
          try {
            await client.workflow.start('rolloutAttempt', {
              workflowId: s.workflowId,
              taskQueue: input.taskQueue,
              // An attempt runs once: a start repeated after it ended must not run it again.
              workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
              staticSummary: s.summary,
              staticDetails: s.details,
              typedSearchAttributes: [
                { key: RUN_NAME, value: input.run },
                { key: ROLLOUT_STATUS, value: 'running' },
                { key: ROLLOUT_CONTINUED, value: s.continued },
              ],
              args: [s.input],
            });
            out.started += 1;
          } catch (err) {
            if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
            out.alreadyStarted += 1;
          }
          // A worker that dies in the middle of a batch is noticed by the heartbeat timeout.
          ctx.heartbeat(next);
        }
      };
      await Promise.all(Array.from({ length: Math.min(START_WINDOW, input.starts.length) }, lane));
      return out;
    },
  };
}
