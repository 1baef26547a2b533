// How a checkpoint attempt's outcome leaves its workflow: a failed one as an ApplicationFailure
// that carries it (the run reads it back), and the stage table of its current details.
import { ApplicationFailure, ChildWorkflowFailure, RetryState } from '@temporalio/common';
import { describe, expect, it } from 'vitest';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { CHECKPOINT_FAILED, checkpointDetails, checkpointFailure, outcomeOfFailure } from '../../workflows/checkpoint-outcome.js';

const failed: CheckpointOutcome = {
  checkpointId: 'rollout-step-3-snapshot-7-abc',
  trigger: 'periodic',
  outcome: 'failed',
  reason: 'io_error',
  error: 'discover failed on 1 server(s): weather: no status reply within 3 seconds',
  seconds: { total: 3.161 },
  at: '2026-12-02T23:11:29.735Z',
};

describe('checkpoint outcome', () => {
  it('a failed outcome becomes a non-retryable failure that names the reason and carries the outcome', () => {
    const f = checkpointFailure(failed);
    expect(f).toBeInstanceOf(ApplicationFailure);
    expect(f.type).toBe(CHECKPOINT_FAILED);
    expect(f.nonRetryable).toBe(true);
    expect(f.message).toBe(`checkpoint ${failed.checkpointId} failed (io_error): ${failed.error}`);
    expect(f.details).toEqual([failed]);
  });

  it('the run reads the outcome back from the child failure, and from nothing else', () => {
    const child = new ChildWorkflowFailure(
      'default',
      { workflowId: 'x', runId: 'y' },
      'checkpointAttempt',
      RetryState.NON_RETRYABLE_FAILURE,
      checkpointFailure(failed),
    );
    expect(outcomeOfFailure(child)).toEqual(failed);
    expect(outcomeOfFailure(checkpointFailure(failed))).toEqual(failed);
    const other = new ChildWorkflowFailure(
      'default',
      { workflowId: 'x', runId: 'y' },
      'checkpointAttempt',
      RetryState.NON_RETRYABLE_FAILURE,
      ApplicationFailure.nonRetryable('boom', 'invariant_error'),
    );
    expect(outcomeOfFailure(other)).toBeUndefined();
    expect(outcomeOfFailure(new Error('boom'))).toBeUndefined();
  });

  it('the details: outcome, error, snapshot and one row per stage that ran, in pipeline order', () => {
    const done: CheckpointOutcome = {
      ...failed,
      outcome: 'completed',
      reason: 'completed',
      error: undefined,
      snapshotDir: '/ckpt/step_3/rollout_snapshots/snapshot_000007',
      seconds: { resume: 0.05, prepare: 0.4161, commit: 0.2987, candidates: 0.5, total: 0.962, gym_participant_seconds: 0.76 },
    };
    expect(checkpointDetails(done, 'demo').split('\n')).toEqual([
      '**periodic checkpoint** `rollout-step-3-snapshot-7-abc` of run `demo`: **completed** (completed)',
      '',
      'snapshot: `/ckpt/step_3/rollout_snapshots/snapshot_000007`',
      '',
      '| stage | seconds |',
      '| --- | ---: |',
      '| candidates (shards write their episodes in flight and ledger parts; no Gym process restarted) | 0.500 |',
      '| prepare (Gym prepares) | 0.416 |',
      '| commit (Gym commits) | 0.299 |',
      '| resume (Gym resumes) | 0.050 |',
      '| total (start to end) | 0.962 |',
    ]);
    expect(checkpointDetails(failed, 'demo')).toContain(`error: ${failed.error}`);
  });
});
