// The shard's batch of attempt starts (activities/attempt-starts.ts) on the test server: each
// attempt workflow started once with its search attributes; a batch tried again (an activity
// retry after a crash) starts nothing twice and counts what existed as started.
import { MockActivityEnvironment, type TestWorkflowEnvironment } from '@temporalio/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAttemptStartActivities, type AttemptStart } from '../../activities/attempt-starts.js';
import type { RolloutAttemptInput } from '../../workflows/rolloutAttempt.js';
import { createTimeSkippingEnv } from '../helpers/temporal.js';

let env: TestWorkflowEnvironment;

beforeAll(async () => {
  env = await createTimeSkippingEnv();
});

afterAll(async () => {
  await env?.teardown();
});

const RUN = 'starts';
const start = (id: string): AttemptStart => ({
  workflowId: `${RUN}/rollout/${id}`,
  summary: `rollout ${id}`,
  details: 'group `p0`',
  continued: id.endsWith('-a1'),
  input: { run: RUN, reportTo: `${RUN}/shard/0`, episode: { rollout_id: id, attempt: 0 } } as RolloutAttemptInput,
});

describe('startRolloutAttempts', () => {
  it('starts each attempt once; a batch sent again starts nothing twice and counts the existing ones as started', async () => {
    const { startRolloutAttempts } = createAttemptStartActivities();
    const activity = new MockActivityEnvironment({}, { client: env.client });
    const starts = ['p0.g0', 'p0.g1', 'p0.g2-a1'].map(start);
    // No worker polls this queue: the attempts stay open, as they would while their first task waits.
    const input = { run: RUN, taskQueue: 'attempt-starts-test', starts };
    expect(await activity.run(startRolloutAttempts, input)).toEqual({ started: 3, alreadyStarted: 0 });
    expect(await activity.run(startRolloutAttempts, { ...input, starts: [...starts, start('p0.g3')] })).toEqual({ started: 1, alreadyStarted: 3 });
    for (const s of [...starts, start('p0.g3')]) {
      const handle = env.client.workflow.getHandle(s.workflowId);
      const d = await handle.describe();
      expect(d.type).toBe('rolloutAttempt');
      expect(d.taskQueue).toBe('attempt-starts-test');
      // Not anyone's child: nothing of its shard's continue-as-new reaches it.
      expect(d.parentExecution).toBeUndefined();
      await handle.terminate('test cleanup');
    }
    // An attempt that ended is never started again under its ID.
    expect(await activity.run(startRolloutAttempts, { ...input, starts: [starts[0]!] })).toEqual({ started: 0, alreadyStarted: 1 });
  });
});
