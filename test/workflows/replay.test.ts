// Replays the committed golden histories (test/workflows/histories/*.json, recorded by
// training-run.test.ts; RECORD_HISTORIES=1 re-records them) against the current workflow code.
// No server: a change to the workflows that alters their commands on these paths fails here.
// Before a release exists no old run can be in flight: re-record them (docs/controller.md).
import type { WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { Worker } from '@temporalio/worker';
import { beforeAll, describe, expect, it } from 'vitest';
import { bundleUnderTest, historyFromJson, installQuietRuntime, readHistories } from './harness.js';

let bundle: WorkflowBundleWithSourceMap;

beforeAll(async () => {
  installQuietRuntime();
  bundle = await bundleUnderTest();
});

const SCENARIOS: Record<string, string[]> = {
  // scenario → workflow types its golden file must contain
  'clean-attempt': ['trainingRun', 'rolloutShard', 'checkpointAttempt', 'rolloutAttempt'],
  'abort-pending': ['trainingRun', 'checkpointAttempt', 'checkpointAttempt'],
  'deadline-held': ['trainingRun', 'rolloutShard', 'checkpointAttempt', 'rolloutAttempt'],
  'deadline-expiry': ['trainingRun', 'rolloutShard', 'rolloutAttempt', 'rolloutAttempt'],
  'late-result': ['trainingRun', 'rolloutShard', 'checkpointAttempt', 'rolloutAttempt'],
  'gym-crash': ['trainingRun', 'rolloutShard', 'checkpointAttempt', 'checkpointAttempt', 'rolloutAttempt', 'rolloutAttempt'],
  'cohort-starts-over': ['trainingRun', 'rolloutShard', 'rolloutAttempt', 'rolloutAttempt'],
};

async function replay(histories: Array<{ workflowId: string; history: unknown }>): Promise<Array<{ workflowId: string; error: unknown }>> {
  const out: Array<{ workflowId: string; error: unknown }> = [];
  const iterable = histories.map((w) => ({ workflowId: w.workflowId, history: historyFromJson(w.history) }));
  for await (const r of Worker.runReplayHistories({ workflowBundle: bundle }, iterable)) out.push({ workflowId: r.workflowId, error: r.error });
  return out;
}

describe('replay of golden histories', () => {
  for (const [scenario, types] of Object.entries(SCENARIOS)) {
    it(`${scenario}: the run and its children replay without nondeterminism`, async () => {
      const workflows = await readHistories(scenario);
      for (const t of new Set(types)) expect(workflows.filter((w) => w.workflowType === t).length).toBeGreaterThanOrEqual(types.filter((x) => x === t).length);
      const results = await replay(workflows);
      expect(results.map((r) => r.workflowId)).toEqual(workflows.map((w) => w.workflowId));
      for (const r of results) expect(r.error, `${r.workflowId}: ${String(r.error)}`).toBeUndefined();
    });
  }

  it('a history whose commands differ from the code is reported as nondeterminism (the check has teeth)', async () => {
    const workflows = await readHistories('clean-attempt');
    const checkpoint = workflows.find((w) => w.workflowType === 'checkpointAttempt')!;
    // As if the code had run another (local) activity first than the one recorded.
    type Marker = { markerName?: string; details?: { data?: { payloads?: Array<{ data: string }> } } };
    const history = structuredClone(checkpoint.history) as { events: Array<{ markerRecordedEventAttributes?: Marker }> };
    const payload = history.events.find((e) => e.markerRecordedEventAttributes?.markerName === 'core_local_activity')!.markerRecordedEventAttributes!.details!
      .data!.payloads![0]!;
    const recorded = JSON.parse(Buffer.from(payload.data, 'base64').toString('utf8')) as { activity_type: string };
    payload.data = Buffer.from(JSON.stringify({ ...recorded, activity_type: 'notTheRecordedActivity' })).toString('base64');
    const [result] = await replay([{ workflowId: checkpoint.workflowId, history }]);
    expect(result?.error).toBeInstanceOf(DeterminismViolationError);
  });
});
