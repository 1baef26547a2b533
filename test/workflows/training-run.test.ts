// The controller's workflows on the time-skipping test server with a real Worker and fake
// activities that throw the real error types (test/workflows/fake-gym.ts). Time only skips while
// the client awaits a result or in `env.sleep`, and never while an activity is open: the server
// locks its clock from an activity's schedule to its completion. A held `/run` or prepare therefore
// means real time (so do activity retry backoffs). Each test has its own run name and task queue;
// tests in this file run one after another (the server clock is global).
import { ApplicationFailure, defaultPayloadConverter } from '@temporalio/common';
import { WorkflowFailedError, WorkflowUpdateStage, type WorkflowHandleWithFirstExecutionRunId } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StartRolloutAttemptsInput } from '../../activities/attempt-starts.js';
import type { CheckpointOutcome, RolloutReport } from '../../protocol/controller.js';
import { parseCaptureKey } from '../../protocol/ids.js';
import type { RunConfig } from '../../protocol/run-config.js';
import { checkpointWorkflowId } from '../../workflows/checkpointAttempt.js';
import { HOLDERS, checkpointNow, runStatus, type Holds, type RunStatus } from '../../workflows/messages.js';
import { rolloutWorkflowId } from '../../workflows/rolloutAttempt.js';
import { PENDING_RETRY_MS } from '../../workflows/run/checkpoints.js';
import { shardWorkflowId } from '../../workflows/rolloutShard.js';
import { trainingRun, type RunSummary } from '../../workflows/trainingRun.js';
import { createTimeSkippingEnv } from '../helpers/temporal.js';
import { FakeGym } from './fake-gym.js';
import { bundleUnderTest, delay, installQuietRuntime, recordHistories, runConfig, until, withWorker } from './harness.js';

let env: TestWorkflowEnvironment;
let bundle: WorkflowBundleWithSourceMap;

beforeAll(async () => {
  installQuietRuntime();
  [env, bundle] = await Promise.all([createTimeSkippingEnv(), bundleUnderTest()]);
});
afterAll(async () => {
  await env?.teardown();
});

type RunHandle = WorkflowHandleWithFirstExecutionRunId<typeof trainingRun>;

async function startRun(cfg: RunConfig): Promise<RunHandle> {
  return env.client.workflow.start(trainingRun, { workflowId: cfg.run.name, taskQueue: cfg.run.task_queue, args: [{ config: cfg }] });
}

const status = (h: RunHandle): Promise<RunStatus> => h.query(runStatus);

async function isClosed(h: RunHandle): Promise<boolean> {
  const d = await h.describe();
  return d.status.name !== 'RUNNING' && d.status.name !== 'CONTINUED_AS_NEW';
}

/** Lets every held `/run` (including ones dispatched meanwhile) finish until the run closes; its result. */
async function finishRun(gym: FakeGym, h: RunHandle): Promise<RunSummary> {
  await until(async () => {
    gym.finishAll();
    return isClosed(h);
  }, 'the run to close');
  return h.result();
}

/** The run fails: its failure (an ApplicationFailure typed by the reason). */
async function runFailure(h: RunHandle, timeoutMs?: number): Promise<ApplicationFailure> {
  await until(() => isClosed(h), 'the run to close', timeoutMs);
  const err = await h.result().then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(WorkflowFailedError);
  const cause = (err as WorkflowFailedError).cause;
  expect(cause).toBeInstanceOf(ApplicationFailure);
  return cause as ApplicationFailure;
}

/** An update that may race the run failing on the same outcome: the outcome, or undefined. */
async function checkpointMayFail(h: RunHandle): Promise<CheckpointOutcome | undefined> {
  return h.executeUpdate(checkpointNow).catch(() => undefined);
}

/** Every `/run` call went out at most once per capture key (no duplicate dispatch). */
function expectRunsOnce(gym: FakeGym): void {
  const keys = gym.runKeys();
  expect(new Set(keys).size, `duplicate /run calls: ${keys.join(' ')}`).toBe(keys.length);
}

async function historyEvents(workflowId: string) {
  return (await env.client.workflow.getHandle(workflowId).fetchHistory()).events ?? [];
}

/**
 * The attempt asks its shards for their candidates with the checkpoint's holds in the request
 * (their admission closes with it, and each writes its ledger part with its candidates), prepares
 * Gym once every shard answered, sends no request beside the commit, and once Gym resumed releases
 * their hold itself. Both go from local activities (activities/shard-signals.ts), not as signal
 * commands: each shard's history has the request.
 */
async function expectShardRequestsBeforePrepare(checkpointWorkflow: string, shards = 1): Promise<void> {
  const events = await historyEvents(checkpointWorkflow);
  expect(events.filter((e) => e.signalExternalWorkflowExecutionInitiatedEventAttributes)).toEqual([]);
  const sends = events.filter((e) => localActivityType(e) === 'signalShards').map((e) => Number(e.eventId));
  const prepareAt = Number(events.find((e) => localActivityType(e) === 'gymPrepare')!.eventId);
  expect(sends).toHaveLength(2); // the candidates requests, then the release
  expect(sends[0]).toBeLessThan(prepareAt);
  expect(sends[1]).toBeGreaterThan(prepareAt);
  const answered = events.filter((e) => e.workflowExecutionSignaledEventAttributes?.signalName === 'shardAnswer').map((e) => Number(e.eventId));
  expect(Math.max(...answered.slice(0, shards))).toBeLessThan(prepareAt);
  const [run, checkpointId] = checkpointWorkflow.split('/checkpoint/') as [string, string];
  for (let k = 0; k < shards; k++) {
    const requests = (await historyEvents(shardWorkflowId(run, k)))
      .map((e) => e.workflowExecutionSignaledEventAttributes)
      .filter((a) => a?.signalName === 'shardRequest')
      .map((a) => JSON.parse(Buffer.from(a!.input!.payloads![0]!.data!).toString()) as { id: string; kind: string; holds?: { admission: string[] } })
      .filter((r) => r.id.startsWith(`${checkpointId}/req-`));
    expect(requests[0]).toMatchObject({ kind: 'candidates', holds: { admission: [HOLDERS.checkpoint] } });
  }
}

type HistoryEvent = Awaited<ReturnType<typeof historyEvents>>[number];

/** The activity type of a local activity's marker, if `e` is one. */
function localActivityType(e: HistoryEvent): string | undefined {
  const m = e.markerRecordedEventAttributes;
  if (m?.markerName !== 'core_local_activity') return undefined;
  const data = m.details?.data?.payloads?.[0]?.data;
  return data ? (JSON.parse(Buffer.from(data).toString('utf8')) as { activity_type?: string }).activity_type : undefined;
}

/** Where the attempt ran `name`: its scheduling (an activity) or its marker (a local activity). */
function stageAt(events: HistoryEvent[], name: string): number {
  return events.findIndex((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === name || localActivityType(e) === name);
}

/**
 * Everything while admission was closed ran in the attempt's worker (allocation, the restart check,
 * Gym's prepare, commit and resume, publication): no activity task of its own, the candidates
 * requests went out in the attempt's first workflow task, and once the shards had answered,
 * prepare, commit, publication and resume ran in one workflow task.
 */
async function expectLocalFileStages(checkpointWorkflow: string): Promise<void> {
  const events = await historyEvents(checkpointWorkflow);
  expect(events.filter((e) => e.activityTaskScheduledEventAttributes)).toEqual([]);
  const local = events.flatMap((e) => localActivityType(e) ?? []);
  expect(local).toEqual(expect.arrayContaining(['allocateSnapshot', 'discoverGym', 'gymPrepare', 'gymCommit', 'finalizeSnapshot', 'gymResume']));
  // Allocation and the restart check added no workflow task of their own: the candidates requests
  // went out in the attempt's first workflow task.
  const asked = stageAt(events, 'signalShards');
  expect(asked).toBeGreaterThan(0);
  expect(events.slice(0, asked).filter((e) => e.workflowTaskCompletedEventAttributes)).toHaveLength(1);
  const between = events.slice(stageAt(events, 'gymPrepare'), stageAt(events, 'gymResume'));
  expect(between.filter((e) => e.workflowTaskCompletedEventAttributes)).toEqual([]);
}

/** The attempt applied no retention; the run applied it after the attempt's result. */
async function expectRetentionByRun(runWorkflow: string, checkpointWorkflow: string): Promise<void> {
  expect((await historyEvents(checkpointWorkflow)).some((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'applyRetention')).toBe(false);
  const events = await historyEvents(runWorkflow);
  const ended = events.findIndex((e) => e.childWorkflowExecutionCompletedEventAttributes?.workflowType?.name === 'checkpointAttempt');
  const retention = events.findIndex((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'applyRetention');
  expect(ended).toBeGreaterThan(0);
  expect(retention).toBeGreaterThan(ended);
}

/** Names of the signals a workflow sent to other workflows. */
async function signalsSent(workflowId: string): Promise<string[]> {
  return (await historyEvents(workflowId)).flatMap((e) => e.signalExternalWorkflowExecutionInitiatedEventAttributes?.signalName ?? []);
}

/** Names of the signals the attempt received before it published. */
async function signalsBeforePublish(checkpointWorkflow: string): Promise<string[]> {
  const events = await historyEvents(checkpointWorkflow);
  const publish = stageAt(events, 'finalizeSnapshot');
  expect(publish).toBeGreaterThan(0);
  return events
    .slice(0, publish)
    .flatMap((e) => (e.workflowExecutionSignaledEventAttributes ? [e.workflowExecutionSignaledEventAttributes.signalName ?? ''] : []));
}

/** The shard wrote its ledger part once, with its candidates, before Gym prepared; the calls without it. */
function expectCutBeforePrepare(calls: string[], id: string): string[] {
  expect(calls.filter((c) => c === 'ledger-cut')).toHaveLength(1);
  expect(calls.indexOf('ledger-cut')).toBeLessThan(calls.indexOf(`prepare:${id}`));
  return calls.filter((c) => c !== 'ledger-cut');
}

const rolloutIds = (cfg: RunConfig, gym: FakeGym): string[] => [...new Set(gym.runKeys())].map((k) => rolloutWorkflowId(cfg.run.name, parseCaptureKey(k)!));

describe('checkpoint attempts in a training run', () => {
  it('1. clean attempt: every rollout runs once; cut → prepare → commit → manifest → validate → publish → resume, then retention by the run', async () => {
    const gym = new FakeGym();
    gym.script.holdRuns = true;
    const cfg = runConfig('golden-clean-attempt');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'completed', reason: 'completed', trigger: 'manual', sequence: 1 });
      expect(outcome).toMatchObject({ scopeCount: gym.running.size, restartCount: 0 });
      const id = outcome.checkpointId;
      expect(id).toMatch(/^rollout-step-0-snapshot-1-[0-9a-f]{32}$/);
      const calls = expectCutBeforePrepare(gym.controlCalls(), id);
      expect(calls.slice(0, 6)).toEqual(['allocate:1', `prepare:${id}`, `commit:${id}`, 'manifest', 'validate', 'publish:1']);
      await expectShardRequestsBeforePrepare(checkpointWorkflowId(cfg.run.name, id));
      await expectLocalFileStages(checkpointWorkflowId(cfg.run.name, id));
      // Gym committed every episode in flight: the part the shard wrote with its candidates is the published one.
      expect(gym.count('ledger-cut')).toBe(1);
      expect(gym.published).toEqual([{ checkpoint_id: id, ledger_sha256: gym.ledgerCutDigests[0] }]);
      expect(await signalsBeforePublish(checkpointWorkflowId(cfg.run.name, id))).toEqual(['shardAnswer']);
      // The attempt closed admission in its shard (with its candidates request) and reopened it:
      // the run sent no holds of its own.
      expect((await signalsSent(cfg.run.name)).filter((n) => n === 'setHolds')).toHaveLength(0);
      // Retention runs in the run once it has the outcome, with admission open again.
      await expectRetentionByRun(cfg.run.name, checkpointWorkflowId(cfg.run.name, id));
      await until(() => gym.count('retention') === 1, 'retention');
      expect(expectCutBeforePrepare(gym.controlCalls(), id).slice(6)).toEqual([`resume:${id}`, 'retention']);
      const s = await status(handle);
      expect(s.gates.gymCheckpoint).toBe(false);
      expect(s.lastSnapshot).toBe(outcome.snapshotDir);
      // What the run keeps counts the keys instead of listing them.
      expect(s.checkpoints.at(-1)).toMatchObject({ checkpointId: id, scopeCount: 2, restartCount: 0 });
      expect(s.checkpoints.at(-1)).not.toHaveProperty('scope');
      gym.script.forgetDelayMs = 300;
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4, failedRollouts: 0 });
      expect(gym.runKeys()).toHaveLength(4);
      expectRunsOnce(gym);
      // Every finished rollout was forgotten in Gym before the run returned: no retire marks left behind.
      expect(gym.calls.filter((c) => c.startsWith('forget:')).reduce((n, c) => n + Number(c.slice('forget:'.length)), 0)).toBe(4);
      expect(gym.metrics.map((m) => `${m.outcome}/${m.reason}`)).toEqual(['completed/completed']);
      expect(gym.metrics[0]).not.toHaveProperty('scope');
      await recordHistories(env, 'clean-attempt', [
        cfg.run.name,
        shardWorkflowId(cfg.run.name, 0),
        checkpointWorkflowId(cfg.run.name, id),
        rolloutIds(cfg, gym)[0]!,
      ]);
    });
  });

  it('1b. a result that reaches the run after its early ledger cut: the cut is written again and holds it', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, finishedBeforeCommit: 1 };
    const cfg = runConfig('late-result-cut');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const [finished, parked] = [...gym.running].sort() as [string, string];
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'completed', scopeCount: 2 });
      expect(gym.count('ledger-cut')).toBe(2);
      // The first cut (with the candidates) still had it in flight; the published one has its result.
      const sealed = (ledger: unknown): string[] =>
        Object.values((ledger as { groups: Record<string, { siblings: { rollout_id: string; attempts: { status: string }[] }[] }> }).groups).flatMap((g) =>
          g.siblings.filter((sib) => sib.attempts.at(-1)!.status === 'sealed').map((sib) => sib.rollout_id),
        );
      expect(sealed(gym.ledgerCuts[0])).toEqual([]);
      expect(sealed(gym.ledgerCuts[1])).toEqual([finished]);
      // Something was unsettled after the commit: the shard cut again once it had the result, and that part was published.
      expect(gym.published).toEqual([{ checkpoint_id: outcome.checkpointId, ledger_sha256: gym.ledgerCutDigests[1] }]);
      expect(await signalsBeforePublish(checkpointWorkflowId(cfg.run.name, outcome.checkpointId))).toEqual(['shardAnswer', 'shardAnswer']);
      await finishRun(gym, handle);
      await recordHistories(env, 'late-result', [
        cfg.run.name,
        shardWorkflowId(cfg.run.name, 0),
        checkpointWorkflowId(cfg.run.name, outcome.checkpointId),
        rolloutWorkflowId(cfg.run.name, parseCaptureKey(parked)!),
      ]);
    });
  });

  it('2. prepare not ready → failed/timeout, abort with the same ID, gate reopened, dispatch continues', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, notReady: 1 };
    const cfg = runConfig('prepare-timeout');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'failed', reason: 'timeout', abortPending: false });
      const id = outcome.checkpointId;
      // Nothing committed or published; Gym resumed (aborted) under the same ID.
      expect(expectCutBeforePrepare(gym.controlCalls(), id)).toEqual(['allocate:1', `prepare:${id}`, 'discard', `resume:${id}`]);
      const s = await status(handle);
      expect(s.gates.gymCheckpoint).toBe(false);
      expect(s.pendingAbort).toBeNull();
      expect(s.consecutiveFailures).toBe(1);
      expect(s.lastSnapshot).toBeNull();
      gym.finishAll();
      await until(() => gym.runKeys().length === 4, 'the second group dispatched');
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4 });
      expectRunsOnce(gym);
    });
  });

  it('2b. prepare past its deadline (Gym deadline_exceeded) → failed/timeout (wrapped, keeps timeout); aborted with the same ID (stages before the failing one may hold admission), gate reopened', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, prepareDeadlineExceeded: 1 };
    const cfg = runConfig('prepare-deadline');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'failed', reason: 'timeout', abortPending: false });
      expect(outcome.error).toContain('past the deadline');
      const id = outcome.checkpointId;
      expect(expectCutBeforePrepare(gym.controlCalls(), id)).toEqual(['allocate:1', `prepare:${id}`, 'discard', `resume:${id}`]);
      expect((await status(handle)).gates.gymCheckpoint).toBe(false);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4 });
    });
  });

  it('3a. commit 5xx (gym_transient) retried by the activity retry with the same ID → completed', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, commitFailures: 2, commitFailure: 'transient' };
    const cfg = runConfig('commit-transient');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'completed', reason: 'completed' });
      const id = outcome.checkpointId;
      expect(gym.calls.filter((c) => c.startsWith('commit:'))).toEqual([`commit:${id}`, `commit:${id}`, `commit:${id}`]);
      expect(gym.count('discard')).toBe(0);
      const summary = await finishRun(gym, handle);
      expect(summary.steps).toBe(2);
    });
  });

  it('3b. commit always failing → failed/io_error, abort with the same ID, the run continues', async () => {
    const gym = new FakeGym();
    // 4 = every attempt of the control activities' retry policy.
    gym.script = { holdRuns: true, commitFailures: 4, commitFailure: 'transient' };
    const cfg = runConfig('commit-failing');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'failed', reason: 'io_error', abortPending: false });
      const id = outcome.checkpointId;
      expect(expectCutBeforePrepare(gym.controlCalls(), id)).toEqual([
        'allocate:1',
        `prepare:${id}`,
        ...Array<string>(4).fill(`commit:${id}`),
        'discard',
        `resume:${id}`,
      ]);
      expect((await status(handle)).gates.gymCheckpoint).toBe(false);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4 });
    });
  });

  it('3c. commit refusal (export_failed, non-retryable) → io_error (wrapped Gym failure), not run-ending', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, commitFailures: 1, commitFailure: 'refusal' };
    const cfg = runConfig('commit-refused');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'failed', reason: 'io_error' });
      expect(outcome.error).toContain('refused');
      const id = outcome.checkpointId;
      // Not retried by the activity (non-retryable), aborted with the same ID.
      expect(expectCutBeforePrepare(gym.controlCalls(), id)).toEqual(['allocate:1', `prepare:${id}`, `commit:${id}`, 'discard', `resume:${id}`]);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4 });
      expect(summary.checkpoints.map((c) => c.reason)).toEqual(['io_error']);
    });
  });

  it('4. commit naming other participants than the topology → abort with the same ID, the run fails with invariant_error', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, commitWrongParticipants: true };
    const cfg = runConfig('commit-invariant');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const outcome = await checkpointMayFail(handle);
      if (outcome) expect(outcome).toMatchObject({ outcome: 'failed', reason: 'invariant_error' });
      const failure = await runFailure(handle);
      expect(failure.type).toBe('invariant_error');
      const prepare = gym.calls.find((c) => c.startsWith('prepare:'))!;
      const id = prepare.slice('prepare:'.length);
      expect(expectCutBeforePrepare(gym.controlCalls(), id)).toEqual(['allocate:1', `prepare:${id}`, `commit:${id}`, 'discard', `resume:${id}`]);
      expect(gym.metrics.map((m) => `${m.outcome}/${m.reason}`)).toEqual(['failed/invariant_error']);
    });
  });

  it('5. abort failing, then succeeding with the same ID: admission stays closed; the next attempt resumes it first, then a new ID', async () => {
    const gym = new FakeGym();
    // Not ready → abort; the abort (resume) fails on every activity attempt.
    gym.script = { holdRuns: true, notReady: 1, resumeFailures: 4 };
    const cfg = runConfig('golden-abort-pending');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const first = await handle.executeUpdate(checkpointNow);
      expect(first).toMatchObject({ outcome: 'failed', reason: 'timeout', abortPending: true });
      const id = first.checkpointId;
      expect(expectCutBeforePrepare(gym.controlCalls(), id)).toEqual(['allocate:1', `prepare:${id}`, 'discard', ...Array<string>(4).fill(`resume:${id}`)]);
      let s = await status(handle);
      expect(s).toMatchObject({ phase: 'abort_pending', pendingAbort: id, pendingRelease: null, gates: { gymCheckpoint: true } });
      // The group finishes and is consumed, but nothing new is dispatched while the abort is pending.
      gym.finishAll();
      await until(async () => (await status(handle)).steps === 1, 'step 1');
      await delay(300);
      expect(gym.runKeys()).toHaveLength(2);
      s = await status(handle);
      expect(s.gates.gymCheckpoint).toBe(true);
      expect(s.inFlight).toBe(0);

      const callsBefore = gym.calls.length;
      const second = await handle.executeUpdate(checkpointNow);
      expect(second).toMatchObject({ outcome: 'completed', reason: 'completed' });
      expect(second.checkpointId).not.toBe(id);
      const next = gym.calls.slice(callsBefore).filter((c) => !c.startsWith('run:') && !c.startsWith('forget:') && c !== 'discover');
      expect(next.slice(0, 4)).toEqual([`resume:${id}`, 'allocate:2', 'ledger-cut', `prepare:${second.checkpointId}`]);
      s = await status(handle);
      expect(s).toMatchObject({ pendingAbort: null, gates: { gymCheckpoint: false }, consecutiveFailures: 0 });
      await until(() => gym.runKeys().length === 4, 'dispatch reopened');
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4 });
      expectRunsOnce(gym);
      await recordHistories(env, 'abort-pending', [
        cfg.run.name,
        checkpointWorkflowId(cfg.run.name, id),
        checkpointWorkflowId(cfg.run.name, second.checkpointId),
      ]);
    });
  });

  it('5b. a pending abort retried by its timer with no periodic checkpoint set: the abort goes through, and no new attempt follows it', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, notReady: 1, resumeFailures: 4 };
    const cfg = runConfig('abort-retried-by-timer');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const first = await handle.executeUpdate(checkpointNow);
      expect(first).toMatchObject({ outcome: 'failed', reason: 'timeout', abortPending: true });
      await until(async () => (await status(handle)).pendingAbort === null, 'the timer to retry the abort', PENDING_RETRY_MS + 10_000);
      // Past another retry period: a retry is not a periodic checkpoint.
      await delay(PENDING_RETRY_MS + 1_000);
      expect(gym.calls.filter((c) => c.startsWith('allocate:') || c.startsWith('prepare:'))).toEqual(['allocate:1', `prepare:${first.checkpointId}`]);
      expect(gym.metrics.map((m) => `${m.outcome}/${m.reason}`)).toEqual(['failed/timeout']);
      expect((await status(handle)).gates.gymCheckpoint).toBe(false);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4 });
      expectRunsOnce(gym);
    });
  }, 60_000);

  it('6. resume failing after publish → failed/release_pending; dispatch stays closed; the next attempt releases the same ID → completed', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, resumeFailures: 4 };
    const cfg = runConfig('release-pending');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const first = await handle.executeUpdate(checkpointNow);
      expect(first).toMatchObject({ outcome: 'failed', reason: 'release_pending', releasePending: true, sequence: 1 });
      expect(first.snapshotDir).toMatch(/snapshot_000001$/);
      const id = first.checkpointId;
      const calls = expectCutBeforePrepare(gym.controlCalls(), id);
      expect(calls.slice(0, 6)).toEqual(['allocate:1', `prepare:${id}`, `commit:${id}`, 'manifest', 'validate', 'publish:1']);
      await until(() => gym.count('retention') === 1, 'retention');
      expect(expectCutBeforePrepare(gym.controlCalls(), id).slice(6)).toEqual([...Array<string>(4).fill(`resume:${id}`), 'retention']);
      let s = await status(handle);
      // Published and durable, Gym still paused: distinct from a pre-publication failure.
      expect(s).toMatchObject({
        phase: 'release_pending',
        pendingRelease: id,
        pendingAbort: null,
        lastSnapshot: first.snapshotDir,
        gates: { gymCheckpoint: true },
      });
      gym.finishAll();
      await until(async () => (await status(handle)).steps === 1, 'step 1');
      await delay(300);
      expect(gym.runKeys()).toHaveLength(2);

      const callsBefore = gym.calls.length;
      const second = await handle.executeUpdate(checkpointNow);
      expect(second).toMatchObject({ checkpointId: id, outcome: 'completed', reason: 'completed', snapshotDir: first.snapshotDir });
      // Only the release: no new prepare, nothing new published.
      expect(gym.calls.slice(callsBefore).filter((c) => !c.startsWith('run:') && !c.startsWith('forget:'))).toEqual([`resume:${id}`]);
      s = await status(handle);
      expect(s).toMatchObject({ pendingRelease: null, gates: { gymCheckpoint: false }, consecutiveFailures: 0 });
      await until(() => gym.runKeys().length === 4, 'dispatch reopened');
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4, lastSnapshot: first.snapshotDir });
      expect(summary.checkpoints.map((c) => `${c.outcome}/${c.reason}`)).toEqual(['failed/release_pending', 'completed/completed']);
    });
  });

  it('7. max_consecutive_failures consecutive failed attempts end the run', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, notReady: 2 };
    const cfg = runConfig('consecutive-failures', { rollout_checkpointing: { max_consecutive_failures: 2 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const first = await handle.executeUpdate(checkpointNow);
      expect(first).toMatchObject({ outcome: 'failed', reason: 'timeout' });
      expect(await isClosed(handle)).toBe(false);
      expect((await status(handle)).consecutiveFailures).toBe(1);
      await checkpointMayFail(handle);
      const failure = await runFailure(handle);
      expect(failure.type).toBe('max_consecutive_failures');
      expect(gym.metrics.map((m) => m.reason)).toEqual(['timeout', 'timeout']);
    });
  });

  it('13. a recovery setup that cannot work ends the run before any dispatch, naming the config keys', async () => {
    const gym = new FakeGym();
    const cfg = runConfig('bad-recovery-setup', {
      rollout_recovery: { target_level: 'sibling', agent_target_level_overrides: { no_such_agent: 'prompt_group', agent: 'turn' } },
    });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      const failure = await runFailure(handle);
      expect(failure.type).toBe('invalid_recovery_setup');
      expect(failure.message).toContain('rollout_recovery.agent_target_level_overrides.no_such_agent: agent no_such_agent was not found by Gym discovery');
      expect(failure.message).toContain(
        'rollout_recovery.agent_target_level_overrides.agent: override turn is finer than rollout_recovery.target_level sibling',
      );
      expect(gym.calls.filter((c) => c.startsWith('run:'))).toEqual([]);
    });
  });

  it('10. no dispatch while the Gym checkpoint gate is closed: finished rollouts start nothing until the checkpoint resumes', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, holdPrepare: true };
    const cfg = runConfig('gate-closed-dispatch');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const update = await handle.startUpdate(checkpointNow, { waitForStage: WorkflowUpdateStage.ACCEPTED });
      await until(() => gym.count('prepare:') === 1, 'prepare');
      expect((await status(handle)).gates.gymCheckpoint).toBe(true);
      gym.finishAll();
      // Both sealed (no step advances during a checkpoint, and nothing is dispatched).
      await until(async () => {
        const st = await status(handle);
        return st.completedRollouts === 2 && st.inFlight === 0;
      }, 'the group sealed');
      await delay(300);
      expect(gym.runKeys()).toHaveLength(2);
      expect((await status(handle)).gates.gymCheckpoint).toBe(true);
      gym.releasePrepare();
      const outcome = await update.result();
      expect(outcome).toMatchObject({ outcome: 'completed' });
      await until(() => gym.runKeys().length === 4, 'dispatch after resume');
      // The second group's runs went out only after the resume.
      expect(gym.calls.indexOf(`resume:${outcome.checkpointId}`)).toBeLessThan(gym.calls.indexOf(`run:${gym.runKeys()[2]!}`));
      await finishRun(gym, handle);
    });
  });
});

describe('live failures', () => {
  it('17. at prompt_group granularity a failed sibling stops its cohort-mates still running (retired before they report), and the cohort starts over together', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('cohort-starts-over', {
      grpo: { num_generations_per_prompt: 3, max_num_steps: 1 },
      rollout_recovery: { target_level: 'prompt_group' },
    });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 3, 'the cohort in flight');
      const [failed, ...mates] = [...gym.running].sort();
      gym.failRun(failed!);
      // The mates are retired (their /run ends) without anyone finishing them; then all three rerun.
      await until(() => mates.every((k) => gym.endedRuns().has(k)), 'the cohort-mates stopped');
      for (const k of mates)
        expect(
          gym.calls.some((c) => c.startsWith('retire:') && c.includes(k)),
          k,
        ).toBe(true);
      await until(() => gym.running.size === 3, 'the cohort rerunning as the next attempt');
      expect([...gym.running].sort()).toEqual([failed!, ...mates].map((k) => `${k}-a1`));
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 3, failedRollouts: 1 });
      expectRunsOnce(gym);
      await recordHistories(env, 'cohort-starts-over', [
        cfg.run.name,
        shardWorkflowId(cfg.run.name, 0),
        ...mates.map((k) => rolloutWorkflowId(cfg.run.name, parseCaptureKey(k)!)),
      ]);
    });
  });
});

describe('lost activity tasks', () => {
  it('18. a /run task no worker takes within controller.schedule_to_start_timeout_s (a task the server lost) is scheduled again, and the attempt goes on', async () => {
    const gym = new FakeGym();
    const cfg = runConfig('lost-run-task', {
      run: { rollout_task_queue: 'tq-lost-run-task-rollouts' },
      grpo: { max_num_steps: 1 },
      controller: { schedule_to_start_timeout_s: 1 },
    });
    // The attempts' workflows run on the rollout task queue; nobody polls it for activities yet.
    const attempts = await Worker.create({ connection: env.nativeConnection, taskQueue: cfg.run.rollout_task_queue, workflowBundle: bundle });
    await withWorker(env, bundle, gym, cfg, () =>
      attempts.runUntil(async () => {
        const handle = await startRun(cfg);
        // Nobody polls the rollout task queue for activities yet: both /run tasks wait past the timeout.
        const attemptId = rolloutWorkflowId(cfg.run.name, { rollout_id: `${cfg.run.name}.p0.g0`, attempt: 0 });
        const timedOut = async (): Promise<number> => {
          const history = await env.client.workflow
            .getHandle(attemptId)
            .fetchHistory()
            .catch(() => undefined);
          return (history?.events ?? []).filter((e) => e.activityTaskTimedOutEventAttributes).length;
        };
        await until(async () => (await timedOut()) >= 1, 'the first /run task to time out unstarted', 20_000);
        expect(gym.runKeys()).toEqual([]);
        const rollouts = await Worker.create({
          connection: env.nativeConnection,
          taskQueue: cfg.run.rollout_task_queue,
          activities: { runEpisode: gym.activities().runEpisode! },
        });
        const summary = await rollouts.runUntil(handle.result());
        expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 0 });
        expectRunsOnce(gym);
        const history = await env.client.workflow.getHandle(attemptId).fetchHistory();
        const scheduled = (history.events ?? []).filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'runEpisode');
        expect(scheduled.length).toBeGreaterThanOrEqual(2);
      }),
    );
  }, 60_000);
});

describe('Gym crashes (no crash ends a run)', () => {
  /** A checkpoint whose prepare is held when Gym dies: the prepare breaks (unreachable). */
  async function checkpointCaughtByCrash(gym: FakeGym, handle: RunHandle): Promise<CheckpointOutcome> {
    gym.script.holdPrepare = true;
    const before = gym.count('prepare:');
    const update = handle.executeUpdate(checkpointNow);
    await until(() => gym.count('prepare:') === before + 1, 'the prepare held');
    gym.crash();
    gym.releasePrepare();
    return update;
  }

  it('14. two Gym crashes, each breaking the checkpoint in flight after a real failure, with max_consecutive_failures 2: each recovery resets the count, the run finishes', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('two-gym-crashes', { rollout_checkpointing: { max_consecutive_failures: 2 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      for (const crash of [1, 2]) {
        await until(() => gym.running.size === 2, `a group in flight before crash ${crash}`);
        // A failure of a Gym that is up counts…
        gym.script.notReady = 1;
        expect(await handle.executeUpdate(checkpointNow)).toMatchObject({ outcome: 'failed', reason: 'timeout' });
        expect((await status(handle)).consecutiveFailures).toBe(1);
        // …one that only found Gym down does not.
        const broken = await checkpointCaughtByCrash(gym, handle);
        expect(broken).toMatchObject({ outcome: 'failed', reason: 'io_error', gymUnreachable: true });
        expect(await isClosed(handle)).toBe(false);
        await until(async () => (await status(handle)).phase === 'waiting_for_gym', 'the run waiting for Gym');
        gym.comeBack();
        await until(async () => (await status(handle)).consecutiveFailures === 0, `the recovery after crash ${crash}`);
      }
      // The recovery settled the broken attempt's pending abort: the retry timer it had armed is
      // stale, and no checkpoint follows when it would have fired (no periodic checkpoint is set).
      await delay(PENDING_RETRY_MS + 1_000);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4, failedRollouts: 0 });
      expect(summary.recoveries).toHaveLength(2);
      // Each crash restarted the group in flight as the next attempt (nothing was published to continue).
      expect(summary.recoveries.map((r) => r.restarted)).toEqual([2, 2]);
      expect(gym.metrics.map((m) => `${m.outcome}/${m.reason}${m.gymUnreachable ? '/unreachable' : ''}`)).toEqual([
        'failed/timeout',
        'failed/io_error/unreachable',
        'failed/timeout',
        'failed/io_error/unreachable',
      ]);
      expectRunsOnce(gym);
    });
  });

  it('15. Gym down longer than the control retries: the recovery waits for it (status waiting_for_gym), then restores and goes on', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('gym-slow-to-return');
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      const saved = await handle.executeUpdate(checkpointNow);
      expect(saved).toMatchObject({ outcome: 'completed' });
      await checkpointCaughtByCrash(gym, handle);
      await until(async () => (await status(handle)).phase === 'waiting_for_gym', 'the run waiting for Gym');
      const waiting = await status(handle);
      expect(waiting.waitingForGymSince).not.toBeNull();
      // Well past the control calls' retries (4 attempts, ~7 s): still waiting, not failed.
      await delay(9_000);
      expect(await isClosed(handle)).toBe(false);
      expect((await status(handle)).phase).toBe('waiting_for_gym');
      gym.comeBack();
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 2, completedRollouts: 4, failedRollouts: 0 });
      // The saved episodes continue as attempt 1 from the snapshot taken before the crash.
      expect(summary.recoveries).toHaveLength(1);
      expect(summary.recoveries[0]!.continued).toBe(2);
      expect(gym.calls.some((c) => c.startsWith('restore:'))).toBe(true);
      expect((await status(handle).catch(() => undefined))?.waitingForGymSince ?? null).toBeNull();
      const [first, crashed] = gym.metrics.map((m) => checkpointWorkflowId(cfg.run.name, m.checkpointId));
      const attempts = [...new Set(gym.runKeys())].filter((k) => k.endsWith('.g0') || k.endsWith('.g0-a1'));
      await recordHistories(env, 'gym-crash', [
        cfg.run.name,
        shardWorkflowId(cfg.run.name, 0),
        first!,
        crashed!,
        ...attempts.map((k) => rolloutWorkflowId(cfg.run.name, parseCaptureKey(k)!)),
      ]);
    });
  }, 60_000);

  it("19. rollouts that fail while a Gym server is down are the crash's: the run looks at Gym, recovers, and reruns them without charging an attempt (chaos seed 109)", async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    // One attempt per sibling: a charged failure would give the sibling up (masked, reward 0).
    const cfg = runConfig('failures-under-crash', { grpo: { max_num_steps: 1 }, async_rl: { max_attempts_per_sibling: 1 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      const keys = [...gym.running].sort();
      // A tool server dies: the environment (spared) fails both episodes, connection refused.
      gym.crash(keys);
      for (const k of keys) gym.failRun(k, 'tool call failed: connect ECONNREFUSED 127.0.0.1:3');
      await until(() => gym.count('discover') >= 2, 'the run looking at Gym');
      await delay(500);
      gym.comeBack();
      await until(() => keys.every((k) => gym.runKeys().includes(`${k}-a1`)), 'both rerun as attempt 1');
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 0, rewardPerStep: [1] });
      expect(summary.recoveries).toHaveLength(1);
      expectRunsOnce(gym);
    });
  }, 60_000);

  it("19b. rollouts that fail while Gym is too busy to answer a look: the shard looks again, the same processes answer, and each failure is its episode's own", async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('failures-gym-busy', { grpo: { max_num_steps: 1 }, async_rl: { max_attempts_per_sibling: 2 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      const keys = [...gym.running].sort();
      const looksBefore = gym.count('discover');
      gym.busyLooks = 2;
      for (const k of keys) gym.failRun(k, 'verify: HTTP 503');
      // Two looks time out (a busy Gym, nothing refused), the third finds the same processes: no
      // crash, no recovery; each failure costs its sibling an attempt and it runs again.
      await until(() => keys.every((k) => gym.runKeys().includes(`${k}-a1`)), 'both rerun as attempt 1', 30_000);
      expect(gym.count('discover') - looksBefore).toBeGreaterThanOrEqual(3);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 2 });
      expect(summary.recoveries).toHaveLength(0);
      expectRunsOnce(gym);
    });
  }, 60_000);

  it('16. a Gym that does not come back within controller.gym_recovery_timeout_s ends the run with gym_unavailable', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('gym-never-returns', { controller: { gym_recovery_timeout_s: 10 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the first group in flight');
      await checkpointCaughtByCrash(gym, handle);
      // The wait for Gym is a pending activity retried for gym_recovery_timeout_s (10 s at least),
      // and the test server's clock does not skip while an activity is open: 10 s of real time.
      const failure = await runFailure(handle, 40_000);
      expect(failure.type).toBe('gym_unavailable');
      expect(failure.message).toContain('controller.gym_recovery_timeout_s (10 s)');
    });
  }, 60_000);
});

// The test server's clock does not skip while any activity is open (it locks time from the
// schedule of an activity to its completion), and a held `/run` or prepare is an open activity: so
// these scenarios run in real time with a 2-second `rollout_timeout_s` instead of `env.sleep`.
const BUDGET_S = 2;

describe(`rollout deadlines (async_rl.rollout_timeout_s: ${BUDGET_S}, real time)`, () => {
  it('8a. a checkpoint holding admission stops the clocks: a prepare held past the budget does not time the rollouts out', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, holdPrepare: true };
    const cfg = runConfig('golden-deadline-held', { async_rl: { rollout_timeout_s: BUDGET_S }, grpo: { max_num_steps: 1 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      const update = await handle.startUpdate(checkpointNow, { waitForStage: WorkflowUpdateStage.ACCEPTED });
      await until(() => gym.count('prepare:') === 1, 'prepare');
      await delay(BUDGET_S * 1000 + 1000);
      expect(gym.endedRuns().size).toBe(0);
      expect(gym.count('retire:')).toBe(0);
      expect(gym.running.size).toBe(2);
      gym.releasePrepare();
      const outcome = await update.result();
      expect(outcome).toMatchObject({ outcome: 'completed' });
      // Reopened with the banked budget (most of it): the rollouts finish within it.
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 0 });
      expect(gym.runKeys()).toHaveLength(2);
      expect(gym.endedRuns().size).toBe(0);
      await recordHistories(env, 'deadline-held', [
        cfg.run.name,
        shardWorkflowId(cfg.run.name, 0),
        checkpointWorkflowId(cfg.run.name, outcome.checkpointId),
        ...rolloutIds(cfg, gym),
      ]);
    });
  });

  it('8b. without a checkpoint the deadline cancels /run and retires the attempt before reporting, and redispatches it as attempt 1', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('golden-deadline-expiry', { async_rl: { rollout_timeout_s: BUDGET_S }, grpo: { max_num_steps: 1 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      // One sibling finishes in time; the other is still running when its deadline fires.
      const [done, late] = [...gym.running].sort() as [string, string];
      gym.finishRun(done);
      const retry = `${late}-a1`;
      await until(() => gym.runKeys().includes(retry), 'the redispatch', BUDGET_S * 1000 + 10_000);
      gym.finishRun(retry);
      // The cancellation (with the next heartbeat) and the retire race; the `/run` ended and the
      // attempt was retired before the redispatch.
      const redispatched = gym.calls.indexOf(`run:${retry}`);
      const ended = gym.calls.findIndex((c) => c === `cancelled:${late}` || c === `retired-run:${late}`);
      expect(ended).toBeGreaterThanOrEqual(0);
      expect(ended).toBeLessThan(redispatched);
      expect(gym.calls.indexOf(`retire:${late}`)).toBeLessThan(redispatched);
      expect(gym.endedRuns().has(done)).toBe(false);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 1 });
      expectRunsOnce(gym);
      const lateId = rolloutWorkflowId(cfg.run.name, parseCaptureKey(late)!);
      const report = await env.client.workflow.getHandle(lateId).result();
      expect(report).toMatchObject({ status: 'timed_out', captureKey: late });
      await recordHistories(env, 'deadline-expiry', [
        cfg.run.name,
        shardWorkflowId(cfg.run.name, 0),
        lateId,
        rolloutWorkflowId(cfg.run.name, parseCaptureKey(retry)!),
      ]);
    });
  });

  it('8d. a /run whose heartbeat would come minutes later still ends at its deadline: the retire ends it', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, silentRuns: true };
    const cfg = runConfig('deadline-silent', { async_rl: { rollout_timeout_s: BUDGET_S }, grpo: { max_num_steps: 1 } });
    expect(cfg.controller.run_heartbeat_timeout_s).toBe(120);
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      const [done, late] = [...gym.running].sort() as [string, string];
      gym.finishRun(done);
      const started = Date.now();
      await until(() => gym.runKeys().includes(`${late}-a1`), 'the redispatch', BUDGET_S * 1000 + 10_000);
      // Well before the first heartbeat (0.8 × 120 s) could have carried the cancellation.
      expect(Date.now() - started).toBeLessThan(BUDGET_S * 1000 + 10_000);
      expect(gym.calls.indexOf(`retired-run:${late}`)).toBeLessThan(gym.calls.indexOf(`run:${late}-a1`));
      gym.finishRun(`${late}-a1`);
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 1 });
      const report = await env.client.workflow.getHandle(rolloutWorkflowId(cfg.run.name, parseCaptureKey(late)!)).result();
      expect(report).toMatchObject({ status: 'timed_out', captureKey: late });
    });
  });

  it('8e. a recovery stops the clocks while Gym is down, then lets an attempt on a surviving server run out its deadline instead of waiting for it for ever', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    const cfg = runConfig('deadline-recovery', { async_rl: { rollout_timeout_s: BUDGET_S }, grpo: { max_num_steps: 1 } });
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      const [crashed, survivor] = [...gym.running].sort() as [string, string];
      // A checkpoint breaks on the crash of the server under `crashed`; `survivor`'s goes on.
      gym.script.holdPrepare = true;
      const update = handle.executeUpdate(checkpointNow);
      await until(() => gym.count('prepare:') === 1, 'the prepare held');
      gym.crash([survivor]);
      gym.releasePrepare();
      expect(await update).toMatchObject({ outcome: 'failed', gymUnreachable: true });
      // Down for longer than the budget: nothing is stopped meanwhile.
      await delay(BUDGET_S * 1000 + 1_000);
      expect(gym.endedRuns().size).toBe(0);
      gym.comeBack();
      // Up again: `crashed` is refused by its fresh process; `survivor` hangs until its deadline.
      await until(() => gym.endedRuns().has(survivor), 'the survivor stopped at its deadline', BUDGET_S * 1000 + 10_000);
      await until(() => gym.runKeys().includes(`${survivor}-a1`) && gym.runKeys().includes(`${crashed}-a1`), 'both rerun as attempt 1');
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 1 });
      expect(summary.recoveries).toHaveLength(1);
      const report = await env.client.workflow.getHandle(rolloutWorkflowId(cfg.run.name, parseCaptureKey(survivor)!)).result();
      expect(report).toMatchObject({ status: 'timed_out', captureKey: survivor });
    });
  }, 60_000);

  it('8c. after the checkpoint the clocks restart with the banked budget (not reset, not left stopped)', async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true, holdPrepare: true };
    const cfg = runConfig('deadline-banked', { async_rl: { rollout_timeout_s: BUDGET_S }, grpo: { max_num_steps: 1 } });
    const holdMs = BUDGET_S * 1000 + 500;
    const preHoldMs = BUDGET_S * 600;
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      await until(() => gym.running.size === 2, 'the group in flight');
      const dispatchedAt = Date.now();
      // Spend most of the budget before the checkpoint holds it: the clock moves by timer ticks,
      // which lag behind real time on a loaded machine, so a banked remainder must stay well
      // apart from a full budget (a reset) even when the clock runs slow.
      await delay(preHoldMs);
      const update = await handle.startUpdate(checkpointNow, { waitForStage: WorkflowUpdateStage.ACCEPTED });
      await until(() => gym.count('prepare:') === 1, 'prepare');
      await delay(holdMs);
      gym.releasePrepare();
      await update.result();
      const releasedAt = Date.now();
      await until(() => gym.endedRuns().size === 2, 'both rollouts timed out', BUDGET_S * 1000 + 10_000);
      const expiredAt = Date.now();
      // Expired after the hold (clocks stopped), and sooner after the release than a full budget
      // would allow (banked remainder; the time spent before the hold is not given back).
      expect(expiredAt - dispatchedAt).toBeGreaterThanOrEqual(BUDGET_S * 1000 + holdMs);
      expect(expiredAt - releasedAt).toBeLessThan(BUDGET_S * 1000);
      await until(() => gym.runKeys().length === 4, 'both redispatched');
      const summary = await finishRun(gym, handle);
      expect(summary).toMatchObject({ steps: 1, completedRollouts: 2, failedRollouts: 2 });
    });
  });
});

describe('continue-as-new', () => {
  it("12. a long run and its shard continue as new; every rollout completes exactly once, and rollouts started before the shard's CAN report to its new execution", async () => {
    const gym = new FakeGym();
    gym.script = { holdRuns: true };
    // The run's history grows by a few events per step (its shard's by a few per rollout): 16 steps cross 200.
    // Two groups in flight; the first rollout is held until its shard has continued as new (the
    // rest go through, past the run's CAN decision too), so it reports to a later execution.
    const cfg = runConfig('continue-as-new', {
      controller: { max_history_events: 200 },
      grpo: { max_num_steps: 16 },
      async_rl: { max_in_flight_groups: 2 },
    });
    const shardId = shardWorkflowId(cfg.run.name, 0);
    await withWorker(env, bundle, gym, cfg, async () => {
      const handle = await startRun(cfg);
      let held: string | undefined;
      let shardContinued = false;
      await until(
        async () => {
          if (gym.running.size > 0) {
            held ??= [...gym.running][0];
            await delay(100);
            if (!shardContinued) {
              const shard = await env.client.workflow.getHandle(shardId).describe();
              shardContinued = shard.runId !== shard.raw.workflowExecutionInfo?.firstRunId;
            }
            for (const key of [...gym.running]) if (key !== held || shardContinued) gym.finishRun(key);
          }
          return isClosed(handle);
        },
        'the run to close',
        40_000,
      );
      const summary = await handle.result();
      expect(summary.continuedAsNew).toBeGreaterThanOrEqual(1);
      expect(summary).toMatchObject({ steps: 16, completedRollouts: 32, failedRollouts: 0 });
      // The run held its shards' reports before it continued as new (no report crossed it, no task
      // was refused), and its next execution released them.
      const runFirst = await env.client.workflow.getHandle(cfg.run.name, handle.firstExecutionRunId).fetchHistory();
      const holdsSent = (events: typeof runFirst.events) =>
        (events ?? [])
          .map((e) => e.signalExternalWorkflowExecutionInitiatedEventAttributes)
          .filter((a) => a?.signalName === 'setHolds')
          .map((a) => defaultPayloadConverter.fromPayload<Holds>(a!.input!.payloads![0]!));
      expect(holdsSent(runFirst.events).at(-1)?.reports).toEqual([HOLDERS.continueAsNew]);
      expect(runFirst.events?.some((e) => e.workflowTaskFailedEventAttributes)).toBe(false);
      const secondRunId = runFirst.events?.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
      expect(secondRunId).toBeDefined();
      const runSecond = await env.client.workflow.getHandle(cfg.run.name, secondRunId).fetchHistory();
      expect(holdsSent(runSecond.events)[0]?.reports).toEqual([]);
      expect(gym.runKeys()).toHaveLength(32);
      expectRunsOnce(gym);
      // The shard continued as new too: rollouts its first execution started reported to a later one.
      const latest = await env.client.workflow.getHandle(shardId).fetchHistory();
      const firstRunId = latest.events?.[0]?.workflowExecutionStartedEventAttributes?.firstExecutionRunId ?? undefined;
      const latestRunId = (await env.client.workflow.getHandle(shardId).describe()).runId;
      expect(firstRunId).not.toBe(latestRunId);
      const history = await env.client.workflow.getHandle(shardId, firstRunId).fetchHistory();
      const started = new Set<string>();
      const reported = new Set<string>();
      for (const e of history.events ?? []) {
        const scheduled = e.activityTaskScheduledEventAttributes;
        if (scheduled?.activityType?.name === 'startRolloutAttempts') {
          const batch = defaultPayloadConverter.fromPayload<StartRolloutAttemptsInput>(scheduled.input!.payloads![0]!);
          for (const s of batch.starts) started.add(s.workflowId);
        }
        const signal = e.workflowExecutionSignaledEventAttributes;
        // From the attempt, or from the `/run` activities (completed ones, batched): the reports name them.
        if (signal?.signalName === 'rolloutFinished') {
          const r = defaultPayloadConverter.fromPayload<RolloutReport>(signal.input!.payloads![0]!);
          reported.add(rolloutWorkflowId(cfg.run.name, r.episode));
        }
        if (signal?.signalName === 'rolloutsFinished') {
          for (const r of defaultPayloadConverter.fromPayload<RolloutReport[]>(signal.input!.payloads![0]!))
            reported.add(rolloutWorkflowId(cfg.run.name, r.episode));
        }
      }
      expect(reported.size).toBeGreaterThan(0);
      const crossed = [...started].filter((id) => !reported.has(id));
      expect(crossed.length).toBeGreaterThan(0);
      // Not the shard's children: nothing of the shard's continue-as-new (or a parent close policy) reaches them.
      const attemptStart = (await env.client.workflow.getHandle(crossed[0]!).fetchHistory()).events?.[0]?.workflowExecutionStartedEventAttributes;
      expect(attemptStart?.parentWorkflowExecution ?? null).toBeNull();
    });
  });
});
