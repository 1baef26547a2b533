// One checkpoint is one trace: a training run on the time-skipping server with a tracing Worker
// (the bundle with workflows/tracing-interceptors.ts, the activity interceptors and the span sink of
// worker-telemetry.ts), the fake Gym of the workflow tests except prepare and resume, which are the
// real activities calling two real control-plane servers over HTTP. Every span goes to an
// in-memory exporter. Also: tracing never changes what a workflow does (histories replay across it).
import { InMemorySpanExporter, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeActivityPools, createActivities, createActivityPools, type Activities } from '../../activities/index.js';
import type { GymTopology } from '../../protocol/controller.js';
import { startTracing, type Tracing } from '../../servers/common/tracing.js';
import { bundleWorkflows, createControllerWorkers } from '../../worker.js';
import { bundleTraces, tracingWorkerOptions } from '../../worker-telemetry.js';
import { checkpointWorkflowId } from '../../workflows/checkpointAttempt.js';
import { checkpointNow } from '../../workflows/messages.js';
import { shardWorkflowId } from '../../workflows/rolloutShard.js';
import { trainingRun } from '../../workflows/trainingRun.js';
import { createTimeSkippingEnv } from '../helpers/temporal.js';
import { buildMemoryServer } from '../participants/memory-participant.js';
import { FakeGym } from '../workflows/fake-gym.js';
import { historyFromJson, historyJson, installQuietRuntime, readHistories, runConfig, terminateOpen, until } from '../workflows/harness.js';

const TOKEN = 'tracing-workflow-test-token';
const exporter = new InMemorySpanExporter();
let tracing: Tracing;
let env: TestWorkflowEnvironment;
let traced: WorkflowBundleWithSourceMap;
let plain: WorkflowBundleWithSourceMap;
const servers: FastifyInstance[] = [];
const urls: Record<string, string> = {};

beforeAll(async () => {
  installQuietRuntime();
  tracing = (await startTracing({ serviceName: 'rollout-controller', exporter }))!;
  // The fake topology's two members, as real control planes on free ports.
  for (const [name, kind] of [
    ['env', 'environment'],
    ['agent', 'agent'],
  ] as const) {
    const { app } = await buildMemoryServer({ instance: name, kind, token: TOKEN });
    await app.listen({ host: '127.0.0.1', port: 0 });
    servers.push(app);
    urls[name] = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  }
  [env, traced, plain] = await Promise.all([createTimeSkippingEnv(), bundleWorkflows(undefined, { tracing: true }), bundleWorkflows()]);
});

afterAll(async () => {
  await env?.teardown();
  await Promise.all(servers.map((s) => s.close()));
  await tracing?.shutdown();
});

const spans = (): ReadableSpan[] => exporter.getFinishedSpans();

/** The span's ancestors by parent span ID, nearest first (the names). */
function ancestry(span: ReadableSpan, all: ReadableSpan[]): string[] {
  const byId = new Map(all.map((s) => [s.spanContext().spanId, s]));
  const names: string[] = [];
  for (let p = span.parentSpanId; p !== undefined; p = byId.get(p)?.parentSpanId) names.push(byId.get(p)?.name ?? `(missing ${p})`);
  return names;
}

async function replay(bundle: WorkflowBundleWithSourceMap, histories: Array<{ workflowId: string; history: unknown }>): Promise<string[]> {
  const errors: string[] = [];
  const iterable = histories.map((h) => ({ workflowId: h.workflowId, history: historyFromJson(h.history) }));
  const options = bundleTraces(bundle) ? { workflowBundle: bundle, sinks: tracingWorkerOptions(tracing).sinks } : { workflowBundle: bundle };
  for await (const r of Worker.runReplayHistories(options, iterable)) if (r.error) errors.push(`${r.workflowId}: ${String(r.error).slice(0, 400)}`);
  return errors;
}

describe('tracing a training run', () => {
  let recorded: Array<{ workflowId: string; history: unknown }> = [];

  it('a checkpoint is one trace: its attempt workflow, the activities it schedules, and every participant server span', async () => {
    const gym = new FakeGym();
    gym.script.holdRuns = true;
    const pools = createActivityPools();
    const real = createActivities({ controlToken: TOKEN, pools });
    const fake = gym.activities();
    const activities: Partial<Activities> = {
      ...fake,
      discoverGym: async (input) => {
        const t: GymTopology = await fake.discoverGym!(input);
        return { ...t, members: t.members.map((m) => ({ ...m, url: urls[m.name]! })) };
      },
      gymPrepare: real.gymPrepare,
      gymResume: real.gymResume,
    };
    const cfg = runConfig('traced-run');
    const worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: cfg.run.task_queue,
      workflowBundle: traced,
      activities,
      maxHeartbeatThrottleInterval: '100 ms',
      ...tracingWorkerOptions(tracing),
    });
    let checkpointId = '';
    try {
      await worker.runUntil(async () => {
        const handle = await env.client.workflow.start(trainingRun, { workflowId: cfg.run.name, taskQueue: cfg.run.task_queue, args: [{ config: cfg }] });
        await until(() => gym.running.size === 2, 'the first group in flight');
        const outcome = await handle.executeUpdate(checkpointNow);
        expect(outcome).toMatchObject({ outcome: 'completed', trigger: 'manual' });
        checkpointId = outcome.checkpointId;
        await until(async () => {
          gym.finishAll();
          const d = await handle.describe();
          return d.status.name === 'COMPLETED';
        }, 'the run to finish');
        const ids = [cfg.run.name, shardWorkflowId(cfg.run.name, 0), checkpointWorkflowId(cfg.run.name, checkpointId)];
        recorded = await Promise.all(
          ids.map(async (workflowId) => ({ workflowId, history: historyJson(await env.client.workflow.getHandle(workflowId).fetchHistory()) })),
        );
      });
    } finally {
      await terminateOpen(env, cfg.run.name);
      await closeActivityPools(pools);
    }

    // The attempt's span ends with the attempt; the sink hands it over after that workflow task.
    await until(() => spans().some((s) => s.name === 'RunWorkflow:checkpointAttempt' && s.attributes.checkpoint_id === checkpointId), 'the attempt span');
    const all = spans();
    const root = all.find((s) => s.name === 'RunWorkflow:checkpointAttempt' && s.attributes.checkpoint_id === checkpointId)!;
    const traceId = root.spanContext().traceId;
    expect(root.parentSpanId).toBeUndefined();
    expect(root.attributes).toMatchObject({
      run: cfg.run.name,
      temporalWorkflowId: checkpointWorkflowId(cfg.run.name, checkpointId),
      temporalWorkflowType: 'checkpointAttempt',
    });
    // The workflow's info is not copied in whole (memo, search attributes): only its IDs.
    expect(Object.keys(root.attributes)).not.toContain('memo');

    const trace = all.filter((s) => s.spanContext().traceId === traceId);
    for (const op of ['prepare', 'resume']) {
      const served = trace.filter((s) => s.name === `gym.control.${op}`);
      expect(served.map((s) => s.attributes['gym.server']).sort(), op).toEqual(['agent', 'env']);
      for (const s of served) {
        expect(s.attributes.checkpoint_id).toBe(checkpointId);
        const up = ancestry(s, all);
        // server span → the activity's span (worker) → the workflow's span that scheduled it → … → the attempt.
        expect(up.slice(0, 2), op).toEqual([`RunActivity:gym${op[0]!.toUpperCase()}${op.slice(1)}`, `StartActivity:gym${op[0]!.toUpperCase()}${op.slice(1)}`]);
        expect(up.at(-1)).toBe('RunWorkflow:checkpointAttempt');
      }
    }
    // Nothing of the rollouts in it: each rollout attempt is a trace of its own.
    expect(trace.filter((s) => s.name.includes('rolloutAttempt') || s.name === 'RunActivity:runEpisode')).toEqual([]);
    const rollouts = all.filter((s) => s.name === 'RunWorkflow:rolloutAttempt');
    expect(rollouts.length).toBeGreaterThanOrEqual(4);
    expect(rollouts.every((s) => s.parentSpanId === undefined && s.links.length === 1)).toBe(true);
    expect(new Set(rollouts.map((s) => s.spanContext().traceId)).size).toBe(rollouts.length);
    // The attempt links back to the span of the run that started it.
    const starter = all.find((s) => s.spanContext().spanId === root.links[0]?.context.spanId);
    expect(starter?.name).toBe('StartChildWorkflow:checkpointAttempt');
    expect(starter?.spanContext().traceId).not.toBe(traceId);
  });

  it('the traced run’s histories replay without tracing, and the golden (untraced) ones with it; replays export nothing', async () => {
    expect(
      recorded.map((r) => r.workflowId),
      'recorded by the test before',
    ).toHaveLength(3);
    const before = spans().length;
    expect(await replay(plain, recorded)).toEqual([]);
    expect(await replay(traced, recorded)).toEqual([]);
    for (const scenario of ['clean-attempt', 'gym-crash']) expect(await replay(traced, await readHistories(scenario)), scenario).toEqual([]);
    expect(spans().length).toBe(before);
  });

  it('a worker refuses a bundle that does not match whether it traces', async () => {
    const base = { address: '127.0.0.1:1', controlToken: TOKEN, connectTimeoutMs: 1 };
    await expect(createControllerWorkers({ ...base, tracing, workflowBundle: plain, attemptBundle: plain })).rejects.toThrow(
      /built without \{ tracing: true \}/,
    );
    await expect(createControllerWorkers({ ...base, workflowBundle: traced, attemptBundle: traced })).rejects.toThrow(/built with \{ tracing: true \}/);
  });

  it('the tracing bundle holds no zod either', () => {
    expect(bundleTraces(traced)).toBe(true);
    expect(bundleTraces(plain)).toBe(false);
    expect(traced.code).not.toMatch(/^\/\*{3}\/ "\.\/node_modules\/zod\//m);
  });
});
