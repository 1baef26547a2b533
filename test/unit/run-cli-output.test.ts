// What `npm run run -- wait` prints: a failed run's cause chain, one line per cause with the
// ApplicationFailure's type (the typed error code), and the progress line built from the status query.
import { ActivityFailure, ApplicationFailure, ChildWorkflowFailure, TerminatedFailure, TimeoutFailure, WorkflowFailedError } from '@temporalio/client';
import { describe, expect, it } from 'vitest';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { failureLines, progressLine, runFailureText } from '../../scripts/run.js';
import type { RunStatus } from '../../workflows/messages.js';

function status(over: Partial<RunStatus> = {}): RunStatus {
  return {
    run: 'r1',
    phase: 'dispatching',
    steps: 3,
    cursor: 12,
    inFlight: 8,
    completedRollouts: 40,
    failedRollouts: 0,
    gates: { weightSync: false, gymCheckpoint: false },
    pendingRelease: null,
    pendingAbort: null,
    lastSnapshot: null,
    consecutiveFailures: 0,
    waitingForGymSince: null,
    checkpoints: [],
    rewardPerStep: [0.25, 0.5, 0.625],
    continuedAsNew: 0,
    shards: 1,
    ...over,
  };
}

const outcome = (o: 'completed' | 'failed'): CheckpointOutcome => ({ outcome: o }) as CheckpointOutcome;

describe('the cause chain of a failed run', () => {
  it('one line per cause, outermost first, with the typed code and the message naming the participant', () => {
    const refusal = ApplicationFailure.nonRetryable('discover failed: policy_model: HTTP 401 unauthorized bad control token\n(second line)', 'unauthorized', {
      operation: 'discover',
    });
    const activity = new ActivityFailure('Activity task failed', 'discoverGym', '1', 'NON_RETRYABLE_FAILURE', 'worker@host', refusal);
    const err = new WorkflowFailedError('Workflow execution failed', activity, 'NON_RETRYABLE_FAILURE');
    expect(failureLines(err)).toEqual([
      'WorkflowFailedError: Workflow execution failed',
      'caused by ActivityFailure (activity discoverGym, NON_RETRYABLE_FAILURE): Activity task failed',
      'caused by ApplicationFailure [unauthorized] (non-retryable): discover failed: policy_model: HTTP 401 unauthorized bad control token (second line)',
    ]);
    expect(runFailureText('r1', err)).toBe(
      [
        'run r1 failed:',
        '  WorkflowFailedError: Workflow execution failed',
        '  caused by ActivityFailure (activity discoverGym, NON_RETRYABLE_FAILURE): Activity task failed',
        '  caused by ApplicationFailure [unauthorized] (non-retryable): discover failed: policy_model: HTTP 401 unauthorized bad control token (second line)',
      ].join('\n'),
    );
  });

  it('a failure of the run itself, a child workflow, a timeout and a termination', () => {
    const own = new WorkflowFailedError(
      'Workflow execution failed',
      ApplicationFailure.nonRetryable('checkpoint c-1 hit a controller invariant: participant counter: invalid_checkpoint_state', 'invariant_error'),
      'NON_RETRYABLE_FAILURE',
    );
    expect(failureLines(own)[1]).toBe(
      'caused by ApplicationFailure [invariant_error] (non-retryable): checkpoint c-1 hit a controller invariant: participant counter: invalid_checkpoint_state',
    );
    const child = new ChildWorkflowFailure(
      'default',
      { workflowId: 'r1/checkpoint/c-2', runId: 'x' },
      'checkpointAttempt',
      'NON_RETRYABLE_FAILURE',
      ApplicationFailure.nonRetryable('counter refused', 'invalid_checkpoint_state'),
    );
    expect(failureLines(new WorkflowFailedError('Workflow execution failed', child, 'NON_RETRYABLE_FAILURE')).slice(1)).toEqual([
      'caused by ChildWorkflowFailure (checkpointAttempt r1/checkpoint/c-2, NON_RETRYABLE_FAILURE): Child Workflow execution failed',
      'caused by ApplicationFailure [invalid_checkpoint_state] (non-retryable): counter refused',
    ]);
    const timedOut = new WorkflowFailedError('Workflow execution timed out', new TimeoutFailure(undefined, undefined, 'START_TO_CLOSE'), 'TIMEOUT');
    expect(runFailureText('r1', timedOut).split('\n')[0]).toBe('run r1 timed out:');
    const terminated = new WorkflowFailedError('Workflow execution terminated', new TerminatedFailure('operator: enough'), 'NON_RETRYABLE_FAILURE');
    expect(runFailureText('r1', terminated).split('\n')).toEqual([
      'run r1 was terminated:',
      '  WorkflowFailedError: Workflow execution terminated',
      '  caused by TerminatedFailure: operator: enough',
    ]);
  });
});

describe('the progress line', () => {
  it('step, mean reward of the last step, rollouts in flight, checkpoints, phase', () => {
    expect(progressLine(status({ checkpoints: [outcome('completed'), outcome('failed'), outcome('completed')] }))).toBe(
      'step 3  mean reward 0.625  in flight 8  checkpoints 2 (+1 failed)  [dispatching]',
    );
    expect(progressLine(status({ steps: 0, rewardPerStep: [], inFlight: 0, phase: 'waiting_for_gym' }))).toBe(
      'step 0  mean reward —  in flight 0  checkpoints 0  [waiting_for_gym]',
    );
    expect(progressLine(status({ checkpoints: Array(50).fill(outcome('completed')) }))).toContain('checkpoints 50 of the last 50');
  });
});
