// The run report's data extraction (scripts/report/data.ts): a golden history of a real Gym crash
// (JSON form, as recorded), and hand-made histories in the SDK's protobuf form for what the golden
// ones lack: continue-as-new, several shards, a run still going, a restore that failed, and a
// checkpoint_metrics.jsonl with repeated, torn and another run's lines.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { defaultPayloadConverter } from '@temporalio/common';
import { describe, expect, it } from 'vitest';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { RunConfigSchema } from '../../protocol/run-config.js';
import {
  buildReportData,
  cumulative,
  decodePayload,
  eventMs,
  type HistoryEventLike,
  MAX_POINTS,
  parseCheckpointMetrics,
  shardIdsOf,
  type WorkflowChain,
} from '../../scripts/report/data.js';
import type { RunStatus } from '../../workflows/messages.js';
import type { RunSummary } from '../../workflows/run/state.js';
import { ROOT } from '../helpers/cli.js';

// --- the golden gym-crash history --------------------------------------------------------------

interface Recorded {
  workflowId: string;
  workflowType: string;
  history: { events: HistoryEventLike[] };
}
const golden = JSON.parse(readFileSync(join(ROOT, 'test/workflows/histories/gym-crash.json'), 'utf8')) as { workflows: Recorded[] };
const chainOf = (w: Recorded): WorkflowChain => ({ workflowId: w.workflowId, executions: [w.history.events] });

describe('a recorded Gym crash (golden history, JSON form)', () => {
  const run = chainOf(golden.workflows.find((w) => w.workflowType === 'trainingRun')!);
  const shards = shardIdsOf(run).map((id) => chainOf(golden.workflows.find((w) => w.workflowId === id)!));
  const events = run.executions[0]!;
  const summary = decodePayload(events[events.length - 1]!.workflowExecutionCompletedEventAttributes!.result!.payloads![0]) as RunSummary;
  const d = buildReportData({ run, shards, generatedAt: '2026-12-02T17:00:00.000Z' });

  it('reads the result: steps, rewards, counts; the checkpoints are the run’s record (no metrics file given)', () => {
    expect(shardIdsOf(run)).toEqual(['gym-slow-to-return/shard/0']);
    expect(d).toMatchObject({ run: 'gym-slow-to-return', state: 'completed', source: 'result', failure: null });
    expect(d.startedAt).toBe(events[0]!.eventTime);
    expect(d.closedAt).toBe(events[events.length - 1]!.eventTime);
    expect(d.rewardPerStep).toEqual(summary.rewardPerStep.map((reward, i) => ({ step: i + 1, reward })));
    expect(d.totals).toMatchObject({ steps: summary.steps, completedRollouts: summary.completedRollouts, shards: 1, executions: 1 });
    expect(d.checkpoints.map((c) => c.checkpointId)).toEqual(summary.checkpoints.map((c) => c.checkpointId));
    expect(d.checkpoints.every((c) => c.source === 'run')).toBe(true);
    // Rounded to the millisecond for display (the record holds sums such as 7.1129999999999995).
    summary.checkpoints.forEach((c, i) => {
      expect(d.checkpoints[i]!.gymParticipant).toBe(Math.round(c.seconds.gym_participant_seconds! * 1000) / 1000);
    });
    expect(d.checkpoints[1]).toMatchObject({ outcome: 'failed', reason: 'io_error', error: 'prepare failed on 2 server(s): ECONNREFUSED' });
  });

  it('the recovery from the history’s settle request and answers matches the run’s record', () => {
    expect(summary.recoveries).toHaveLength(1);
    const rec = summary.recoveries[0]!;
    expect(d.recoveries).toHaveLength(1);
    expect(d.recoveries[0]).toMatchObject({
      startedAt: rec.at,
      continued: rec.continued,
      restarted: rec.restarted,
      cold: false,
      restoreFailed: false,
      shardsAsked: 1,
      shardsAnswered: 1,
    });
    expect(Date.parse(d.recoveries[0]!.at!)).toBeGreaterThan(Date.parse(rec.at));
    expect(d.totals).toMatchObject({ recoveries: 1, continued: 2, restarted: 0 });
  });

  it('dispatch and completion over time come from the shard: every attempt started, every completed report', () => {
    const last = <T>(xs: T[]): T => xs[xs.length - 1]!;
    expect(d.totals.dispatched).toBe(6); // 2 + the crash's 2 continued + the second step's 2
    expect(last(d.timeline.dispatched).n).toBe(6);
    expect(last(d.timeline.completed).n).toBe(summary.completedRollouts);
    expect(last(d.timeline.inFlight).n).toBe(0);
    // The two attempts the crash failed leave flight without completing.
    expect(Math.max(...d.timeline.inFlight.map((p) => p.n))).toBe(2);
    for (const series of Object.values(d.timeline)) {
      expect(series[0]).toEqual({ t: 0, n: 0 });
      for (let i = 1; i < series.length; i++) expect(series[i]!.t).toBeGreaterThan(series[i - 1]!.t);
    }
  });
});

// --- hand-made histories (protobuf form) -------------------------------------------------------

const T0 = Date.parse('2026-01-01T00:00:00.000Z');
const iso = (s: number): string => new Date(T0 + s * 1000).toISOString();
/** `eventTime` as the SDK decodes it: a Timestamp whose seconds are a Long. */
const time = (s: number) => {
  const ms = T0 + Math.round(s * 1000);
  return { seconds: { toNumber: () => Math.floor(ms / 1000) }, nanos: (ms % 1000) * 1e6 };
};
const payloads = (...xs: unknown[]) => ({ payloads: xs.map((x) => defaultPayloadConverter.toPayload(x)!) });
const ev = (s: number, attrs: Omit<HistoryEventLike, 'eventTime'>): HistoryEventLike => ({ eventTime: time(s), ...attrs });
const started = (s: number, input: unknown, continuedExecutionRunId = '') =>
  ev(s, { workflowExecutionStartedEventAttributes: { input: payloads(input), continuedExecutionRunId } });
const child = (s: number, type: string, workflowId: string) =>
  ev(s, { startChildWorkflowExecutionInitiatedEventAttributes: { workflowId, workflowType: { name: type } } });
/** A shard's batch of attempt starts (its `startRolloutAttempts` activity scheduled). */
const attemptsStarted = (s: number, ...ids: string[]) =>
  ev(s, {
    activityTaskScheduledEventAttributes: {
      activityType: { name: 'startRolloutAttempts' },
      input: payloads({ run: RUN, taskQueue: 'q', starts: ids.map((id) => ({ workflowId: `${RUN}/rollout/${id}` })) }),
    },
  });
const signalled = (s: number, signalName: string, input: unknown) =>
  ev(s, { workflowExecutionSignaledEventAttributes: { signalName, input: payloads(input) } });
const signalOut = (s: number, signalName: string, input: unknown) =>
  ev(s, { signalExternalWorkflowExecutionInitiatedEventAttributes: { signalName, input: payloads(input) } });

const RUN = 'hand-made';
const config = RunConfigSchema.parse({
  run: { name: RUN, gym_run_dir: '/gym', checkpoint_dir: '/ckpt' },
  grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 3, max_num_steps: 5, tasksets: ['counter', 'genrm'] },
});
const outcome = (id: string, s: number, extra: Partial<CheckpointOutcome> = {}): CheckpointOutcome => ({
  checkpointId: id,
  trigger: 'periodic',
  outcome: 'completed',
  reason: 'completed',
  seconds: { candidates: 0.01, prepare: 0.1, commit: 0.05, ledger_cut: 0.04, publish: 0.002, resume: 0.03, total: 0.2, admission_closed_seconds: 0.25 },
  at: iso(s),
  ...extra,
});
const settle = (s: number, seq: number, shard: number, opts: { cold?: boolean; restoreFailed?: boolean } = {}) =>
  signalOut(s, 'shardRequest', {
    kind: 'settleRecovery',
    id: `${RUN}/req-${seq}/${shard}`,
    replyTo: RUN,
    dir: '/ckpt/recoveries/x',
    restoreFailed: opts.restoreFailed ?? false,
    cold: opts.cold ?? false,
    topology: {},
  });
const answer = (s: number, seq: number, shard: number, continued: number, restarted: number) =>
  signalled(s, 'shardAnswer', { id: `${RUN}/req-${seq}/${shard}`, shard, continued, restarted });
const report = (s: number, captureKey: string, status: string) =>
  signalled(s, 'rolloutFinished', { captureKey, status, reward: status === 'completed' ? 1 : null });
/** Completed reports of one worker's `/run`s, in one signal. */
const reports = (s: number, ...captureKeys: string[]) =>
  signalled(
    s,
    'rolloutsFinished',
    captureKeys.map((captureKey) => ({ captureKey, status: 'completed', reward: 1 })),
  );

/** Two executions (a continue-as-new at 7 s), two shards, two recoveries (the first's restore failed), still running. */
function handMade(): { run: WorkflowChain; shards: WorkflowChain[] } {
  const carried = {
    steps: 2,
    rewardPerStep: [0.5, 0.25],
    completedRollouts: 12,
    failedRollouts: 1,
    trainerVersion: 2,
    checkpoints: [outcome('ck-1', 2)],
    recoveries: [
      { at: iso(4), restoreId: 'restore-1', snapshotDir: null, continued: 3, restarted: 1, continuedSample: [], error: 'restore refused: not fresh' },
    ],
  };
  const run: WorkflowChain = {
    workflowId: RUN,
    executions: [
      [
        started(0, { config }),
        child(0.1, 'rolloutShard', `${RUN}/shard/0`),
        child(0.1, 'rolloutShard', `${RUN}/shard/1`),
        child(1.5, 'checkpointAttempt', `${RUN}/checkpoint/ck-1`),
        settle(5, 3, 0, { restoreFailed: true }),
        settle(5.5, 3, 0, { restoreFailed: true }), // the same request signalled again
        answer(6, 3, 0, 3, 1),
        answer(6.1, 3, 0, 3, 1), // and answered twice
        ev(7, { workflowExecutionContinuedAsNewEventAttributes: { input: payloads({ config, state: carried }) } }),
      ],
      [
        started(7.1, { config, state: carried }, 'first-run-id'),
        child(8, 'checkpointAttempt', `${RUN}/checkpoint/ck-2`),
        settle(9, 8, 0),
        settle(9, 8, 1),
        answer(10, 8, 0, 2, 0),
        answer(10.2, 8, 1, 0, 4),
      ],
    ],
  };
  const shard0: WorkflowChain = {
    workflowId: `${RUN}/shard/0`,
    executions: [
      [attemptsStarted(1, 'a', 'b'), report(3, 'a', 'completed'), report(3.5, 'b', 'failed')],
      [attemptsStarted(8, 'b-a1'), reports(9, 'a', 'b-a1')],
    ],
  };
  const shard1: WorkflowChain = { workflowId: `${RUN}/shard/1`, executions: [[attemptsStarted(1.2, 'c')]] };
  return { run, shards: [shard0, shard1] };
}

const status: RunStatus = {
  run: RUN,
  phase: 'running',
  steps: 3,
  cursor: 8,
  inFlight: 1,
  completedRollouts: 14,
  failedRollouts: 1,
  gates: { weightSync: false, gymCheckpoint: false },
  pendingRelease: null,
  pendingAbort: null,
  lastSnapshot: null,
  consecutiveFailures: 0,
  waitingForGymSince: null,
  checkpoints: [outcome('ck-1', 2), outcome('ck-2', 8.3, { seconds: { prepare: 1.23456789, admission_closed_seconds: 2.0004999 } })],
  rewardPerStep: [0.5, 0.25, 0.123456789],
  continuedAsNew: 1,
  shards: 2,
};

describe('hand-made histories (protobuf form)', () => {
  it('reads protobuf payloads and Long timestamps as well as their JSON', () => {
    expect(decodePayload(defaultPayloadConverter.toPayload({ a: [1, 'x'] }))).toEqual({ a: [1, 'x'] });
    const json = { metadata: { encoding: Buffer.from('json/plain').toString('base64') }, data: Buffer.from('{"a":1}').toString('base64') };
    expect(decodePayload(json)).toEqual({ a: 1 });
    expect(decodePayload(defaultPayloadConverter.toPayload(undefined))).toBeUndefined();
    expect(decodePayload({ metadata: { encoding: 'YmluYXJ5L3BsYWlu' }, data: 'AAE=' })).toBeUndefined(); // binary/plain
    expect(eventMs({ eventTime: time(1.234) })).toBe(T0 + 1234);
    expect(eventMs({ eventTime: iso(1.234) })).toBe(T0 + 1234);
    expect(eventMs({})).toBeNaN();
  });

  it('a running run: steps and rewards from the status query, recoveries from every execution, each signal once', () => {
    const { run, shards } = handMade();
    const d = buildReportData({ run, shards, status, generatedAt: iso(11) });
    expect(d).toMatchObject({ run: RUN, state: 'running', source: 'status query', closedAt: null, startedAt: iso(0) });
    expect(d.config).toEqual({
      checkpointDir: '/ckpt',
      tasksets: ['counter', 'genrm'],
      maxSteps: 5,
      promptsPerStep: 2,
      generationsPerPrompt: 3,
      targetLevel: 'turn',
    });
    expect(d.rewardPerStep).toEqual([
      { step: 1, reward: 0.5 },
      { step: 2, reward: 0.25 },
      { step: 3, reward: 0.1235 },
    ]);
    expect(d.totals).toMatchObject({ steps: 3, completedRollouts: 14, failedRollouts: 1, trainerVersion: null, shards: 2, executions: 2 });
    expect(d.recoveries).toEqual([
      {
        startedAt: iso(4),
        tStart: 4,
        at: iso(5),
        t: 5,
        cold: false,
        restoreFailed: true,
        continued: 3,
        restarted: 1,
        shardsAnswered: 1,
        shardsAsked: 1,
        error: 'restore refused: not fresh',
      },
      // Its record is past the carried state (made after the continue-as-new): no start, no error.
      {
        startedAt: null,
        tStart: null,
        at: iso(9),
        t: 9,
        cold: false,
        restoreFailed: false,
        continued: 2,
        restarted: 4,
        shardsAnswered: 2,
        shardsAsked: 2,
        error: null,
      },
    ]);
    expect(d.totals).toMatchObject({ recoveries: 2, continued: 5, restarted: 5 });
    // Checkpoints from the status (no metrics file given), rounded to the millisecond.
    expect(d.checkpoints.map((c) => [c.checkpointId, c.source, c.t])).toEqual([
      ['ck-1', 'run', 2],
      ['ck-2', 'run', 8.3],
    ]);
    expect(d.checkpoints[1]).toMatchObject({ admissionClosed: 2, stages: { prepare: 1.235 }, total: null });
  });

  it('dispatch and completion across the shards and their continue-as-new: each attempt and report once', () => {
    const { run, shards } = handMade();
    const d = buildReportData({ run, shards, status, generatedAt: iso(11) });
    expect(d.totals.dispatched).toBe(4);
    expect(d.timeline.dispatched).toEqual([
      { t: 0, n: 0 },
      { t: 1, n: 2 },
      { t: 1.2, n: 3 },
      { t: 8, n: 4 },
    ]);
    // `a` reported twice (again in a worker's batch with `b-a1`): counted once.
    expect(d.timeline.completed).toEqual([
      { t: 0, n: 0 },
      { t: 3, n: 1 },
      { t: 9, n: 2 },
    ]);
    expect(d.timeline.inFlight).toEqual([
      { t: 0, n: 0 },
      { t: 1, n: 2 },
      { t: 1.2, n: 3 },
      { t: 3, n: 2 },
      { t: 3.5, n: 1 },
      { t: 8, n: 2 },
      { t: 9, n: 1 },
    ]);
  });

  it('no result and no status answer: the state the newest continue-as-new carried, said in a note', () => {
    const { run, shards } = handMade();
    const d = buildReportData({ run, shards, status: null, generatedAt: iso(11) });
    expect(d.source).toBe('history');
    expect(d.rewardPerStep.map((r) => r.step)).toEqual([1, 2]);
    expect(d.totals).toMatchObject({ steps: 2, completedRollouts: 12, trainerVersion: 2 });
    expect(d.notes.join('\n')).toMatch(/as of the run’s newest continue-as-new/);
  });

  it('a run that took over a checkpoint directory: its rewards are the steps after the one it resumed from', () => {
    const { run, shards } = handMade();
    const result: Partial<RunSummary> = {
      run: RUN,
      steps: 5,
      rewardPerStep: [0.3, 0.4],
      completedRollouts: 12,
      failedRollouts: 0,
      checkpoints: [],
      recoveries: [],
      trainerVersion: 5,
      restoredFrom: { anchor: 'step_3', snapshotDir: '/ckpt/step_3/rollout_snapshots/snapshot_000004', step: 3, trainerVersion: 3, skipped: [] },
    };
    run.executions[1]!.push(ev(12, { workflowExecutionCompletedEventAttributes: { result: payloads(result) } }));
    const d = buildReportData({ run, shards, generatedAt: iso(13) });
    expect(d).toMatchObject({ state: 'completed', source: 'result', closedAt: iso(12) });
    expect(d.restoredFrom).toEqual({ anchor: 'step_3', step: 3, snapshotDir: '/ckpt/step_3/rollout_snapshots/snapshot_000004' });
    expect(d.rewardPerStep).toEqual([
      { step: 4, reward: 0.3 },
      { step: 5, reward: 0.4 },
    ]);
  });

  it('a failed run names its failure and causes', () => {
    const { run, shards } = handMade();
    run.executions[1]!.push(
      ev(12, { workflowExecutionFailedEventAttributes: { failure: { message: 'Gym did not answer', cause: { message: 'ECONNREFUSED' } } } }),
    );
    const d = buildReportData({ run, shards, generatedAt: iso(13) });
    expect(d).toMatchObject({ state: 'failed', failure: 'Gym did not answer: caused by ECONNREFUSED', closedAt: iso(12) });
  });
});

describe('checkpoint_metrics.jsonl', () => {
  const line = (o: CheckpointOutcome): string => JSON.stringify(o);
  const text = [
    line(outcome('old-1', -100)), // another run's, before this one started, in a taken-over directory
    line(outcome('ck-1', 2, { seconds: { prepare: 0.1 + 0.2, gym_participant_seconds: 0.20600000000000002, admission_closed_seconds: 0.3333333 } })),
    line(outcome('ck-1', 2, { seconds: { prepare: 0.1 + 0.2, gym_participant_seconds: 0.20600000000000002, admission_closed_seconds: 0.3333333 } })), // a retried append
    line(outcome('skip-1', 3, { outcome: 'skipped', reason: 'missing_trainer_anchor', seconds: {} })), // no child: in the run's span
    '{"checkpointId":"torn","seco', // a crash mid-write
    '',
  ].join('\n');

  it('parses each checkpoint once, counting repeated and unreadable lines', () => {
    const p = parseCheckpointMetrics(text);
    expect(p.outcomes.map((o) => o.checkpointId)).toEqual(['old-1', 'ck-1', 'skip-1']);
    expect(p).toMatchObject({ lines: 5, duplicates: 1, unreadable: 1 });
    expect(parseCheckpointMetrics('')).toEqual({ outcomes: [], lines: 0, duplicates: 0, unreadable: 0 });
  });

  it('the report keeps this run’s lines, rounded, adds what only the run recorded, and says what it dropped', () => {
    const { run, shards } = handMade();
    const d = buildReportData({ run, shards, status, metrics: { file: '/ckpt/checkpoint_metrics.jsonl', text }, generatedAt: iso(11) });
    expect(d.checkpoints.map((c) => [c.checkpointId, c.source, c.outcome])).toEqual([
      ['ck-1', 'metrics', 'completed'],
      ['skip-1', 'metrics', 'skipped'],
      ['ck-2', 'run', 'completed'], // the file lacks it (its append is best effort)
    ]);
    expect(d.checkpoints[0]).toMatchObject({ admissionClosed: 0.333, gymParticipant: 0.206, stages: { prepare: 0.3 } });
    expect(d.totals.checkpoints).toEqual({ completed: 2, failed: 0, skipped: 1 });
    expect(d.metrics).toEqual({ file: '/ckpt/checkpoint_metrics.jsonl', found: true, lines: 5, duplicates: 1, unreadable: 1, otherRuns: 1 });
    const notes = d.notes.join('\n');
    expect(notes).toMatch(/1 repeated line/);
    expect(notes).toMatch(/1 unreadable line/);
    expect(notes).toMatch(/1 line\(s\) of checkpoint_metrics\.jsonl are another run’s/);
  });

  it('a missing file is said, and the run’s record stands in', () => {
    const { run, shards } = handMade();
    const d = buildReportData({ run, shards, status, metrics: { file: '/ckpt/checkpoint_metrics.jsonl', text: null }, generatedAt: iso(11) });
    expect(d.metrics.found).toBe(false);
    expect(d.checkpoints.map((c) => c.source)).toEqual(['run', 'run']);
    expect(d.notes.join('\n')).toMatch(/no \/ckpt\/checkpoint_metrics\.jsonl/);
  });
});

describe('cumulative series', () => {
  it('counts events of the same millisecond as one point, from t0', () => {
    expect(cumulative([T0 + 2000, T0 + 1000, T0 + 1000, Number.NaN], T0)).toEqual([
      { t: 0, n: 0 },
      { t: 1, n: 2 },
      { t: 2, n: 3 },
    ]);
  });

  it('thins a long run to MAX_POINTS, keeping the first and the last', () => {
    const times = Array.from({ length: 10_000 }, (_, i) => T0 + i * 7);
    const s = cumulative(times, T0);
    expect(s).toHaveLength(MAX_POINTS);
    expect(s[0]).toEqual({ t: 0, n: 1 });
    expect(s[s.length - 1]).toEqual({ t: 69.993, n: 10_000 });
    for (let i = 1; i < s.length; i++) expect(s[i]!.n).toBeGreaterThan(s[i - 1]!.n);
  });
});
