// Tracing between the activities and the Gym servers (servers/common/tracing.ts), over real HTTP on
// 127.0.0.1: a control call and a `/run` made inside a span carry its `traceparent`, and the
// server's span is that span's child. Off (before startTracing), neither side adds anything.
import { context, SpanKind, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import type { FastifyInstance } from 'fastify';
import { Agent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { controlCall, createControlPool, encodeBody } from '../../activities/control-client.js';
import { createRolloutActivities } from '../../activities/rollouts.js';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { createGymApp } from '../../servers/common/app.js';
import { startTracing, traceHeaders, type Tracing } from '../../servers/common/tracing.js';
import { mockEnv } from '../helpers/activity.js';
import { httpJson } from '../helpers/http.js';
import { waitFor } from '../helpers/wait.js';
import { buildMemoryServer } from '../participants/memory-participant.js';

const TOKEN = 'tracing-test-token-0123456789';

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ host: '127.0.0.1', port: 0 });
  const addr = app.server.address();
  if (!addr || typeof addr === 'string') throw new Error('no address');
  return `http://127.0.0.1:${addr.port}`;
}

/** A memory participant (control routes) and an environment-like app whose `/run` replies at once, both listening. */
async function startServers(): Promise<{ participantUrl: string; envUrl: string; headersSeen: Array<Record<string, unknown>>; close(): Promise<void> }> {
  const { app: participant } = await buildMemoryServer({ instance: 'env_a', kind: 'environment', token: TOKEN });
  const env = createGymApp({ name: 'weather_env', kind: 'environment', logLevel: 'silent', processMetrics: false });
  const headersSeen: Array<Record<string, unknown>> = [];
  env.post('/run', async (req) => {
    headersSeen.push({ ...req.headers });
    const { episode_id } = req.body as { episode_id: { rollout_id: string; attempt: number } };
    return { episode_id, task_id: { taskset: 'counter', task_id: 't0' }, result: { reward: 1 }, failure: null };
  });
  const [participantUrl, envUrl] = [await listen(participant), await listen(env)];
  return { participantUrl, envUrl, headersSeen, close: async () => void (await Promise.all([participant.close(), env.close()])) };
}

const runInput = (envUrl: string) => ({
  run: 'r',
  environment: 'weather_env',
  environmentUrl: envUrl,
  episode: { rollout_id: 'run-p0-s0', attempt: 2 },
  task: { prompt: 'x' },
});

describe('tracing off (no startTracing)', () => {
  it('adds no header to the calls', async () => {
    expect(traceHeaders()).toEqual({});
    const servers = await startServers();
    const pool = new Agent();
    try {
      await mockEnv().run(createRolloutActivities(pool).runEpisode, runInput(servers.envUrl));
      expect(Object.keys(servers.headersSeen[0]!)).not.toContain('traceparent');
    } finally {
      await Promise.all([servers.close(), pool.close()]);
    }
  });
});

describe('tracing on', () => {
  const exporter = new InMemorySpanExporter();
  let tracing: Tracing;
  let servers: Awaited<ReturnType<typeof startServers>>;
  const controlPool = createControlPool();
  const runPool = new Agent();

  beforeAll(async () => {
    tracing = (await startTracing({ serviceName: 'test', exporter }))!;
    servers = await startServers();
  });
  afterAll(async () => {
    await Promise.all([servers?.close(), controlPool.close(), runPool.close()]);
    await tracing?.shutdown();
  });

  /** Runs `fn` inside a fresh client span (as an activity's span would be); that span's context. */
  async function inSpan(name: string, fn: () => Promise<unknown>): Promise<{ traceId: string; spanId: string }> {
    const tracer = trace.getTracer('test');
    const span = tracer.startSpan(name);
    try {
      await context.with(trace.setSpan(context.active(), span), fn);
    } finally {
      span.end();
    }
    return span.spanContext();
  }

  /** The first finished span that `matches` (a server span ends with its connection's close, just after the reply). */
  async function finishedSpan(what: string, matches: (s: ReadableSpan) => boolean): Promise<ReadableSpan> {
    let found: ReadableSpan | undefined;
    await waitFor(what, () => (found = exporter.getFinishedSpans().find(matches)) !== undefined, { timeoutMs: 5_000, intervalMs: 10 });
    return found!;
  }

  const serverSpan = (name: string, traceId: string): Promise<ReadableSpan> =>
    finishedSpan(`span ${name} in trace ${traceId}`, (s) => s.name === name && s.spanContext().traceId === traceId);

  it('a control call carries the caller span; the participant span is its child, named by the operation, with the checkpoint ID', async () => {
    const checkpointId = 'ckpt-trace-1';
    let status = 0;
    const caller = await inSpan('RunActivity:gymPrepare', async () => {
      const res = await controlCall({
        url: servers.participantUrl,
        method: 'POST',
        path: `${CONTROL_PREFIX}/prepare`,
        token: TOKEN,
        body: encodeBody({ checkpoint_id: checkpointId, deadline_ts: Date.now() / 1000 + 30 }),
        timeoutMs: 10_000,
        dispatcher: controlPool,
      });
      status = res.status;
    });
    expect(status).toBe(200);
    const span = await serverSpan('gym.control.prepare', caller.traceId);
    expect(span.kind).toBe(SpanKind.SERVER);
    expect(span.parentSpanId).toBe(caller.spanId);
    expect(span.attributes).toMatchObject({
      'gym.server': 'env_a',
      'gym.kind': 'environment',
      checkpoint_id: checkpointId,
      'http.request.method': 'POST',
      'http.route': `${CONTROL_PREFIX}/prepare`,
      'http.response.status_code': 200,
    });
    expect(span.status.code).not.toBe(2);
    // Never the token, nor any header or body beyond the IDs.
    expect(JSON.stringify(span.attributes)).not.toContain(TOKEN);
    expect(Object.keys(span.attributes).sort()).toEqual(
      ['checkpoint_id', 'gym.kind', 'gym.server', 'http.request.method', 'http.response.status_code', 'http.route'].sort(),
    );
  });

  it('a refusal is on the span with its error code; a call without traceparent starts a trace of its own', async () => {
    const res = await httpJson(controlPool, 'GET', `${servers.participantUrl}${CONTROL_PREFIX}/status`, undefined, { authorization: 'Bearer wrong' });
    expect(res.status).toBe(401);
    const refused = await finishedSpan('the refused status call', (s) => s.name === 'gym.control.status' && s.attributes['http.response.status_code'] === 401);
    expect(refused.parentSpanId).toBeUndefined();
    expect(refused.attributes).toMatchObject({ 'gym.error_code': 'unauthorized' });
  });

  it('a /run carries the activity span; the environment span gym.run is its child and names the episode', async () => {
    let report: { status: string } | undefined;
    const caller = await inSpan('RunActivity:runEpisode', async () => {
      report = await mockEnv().run(createRolloutActivities(runPool).runEpisode, runInput(servers.envUrl));
    });
    expect(report?.status).toBe('completed');
    expect(servers.headersSeen.at(-1)?.traceparent).toMatch(new RegExp(`^00-${caller.traceId}-${caller.spanId}-01$`));
    const span = await serverSpan('gym.run', caller.traceId);
    expect(span.parentSpanId).toBe(caller.spanId);
    expect(span.attributes).toMatchObject({ 'gym.server': 'weather_env', rollout_id: 'run-p0-s0', attempt: 2, 'http.response.status_code': 200 });
  });

  it('data-plane routes, /healthz and /metrics get no span', async () => {
    const before = exporter.getFinishedSpans().length;
    await inSpan('caller', async () => {
      await httpJson(runPool, 'GET', `${servers.envUrl}/healthz`, undefined, { ...traceHeaders() });
      await httpJson(runPool, 'GET', `${servers.envUrl}/metrics`, undefined, { ...traceHeaders() });
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(
      exporter
        .getFinishedSpans()
        .slice(before)
        .map((s) => s.name),
    ).toEqual(['caller']);
  });
});
