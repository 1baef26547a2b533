// `/metrics` on real servers over real sockets: an environment server (with its fake agent and
// resources peers) driven through prepare / commit / resume and a restore into a fresh process,
// scraped without the control token and parsed as Prometheus text.
import type { FastifyInstance } from 'fastify';
import { Agent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { ERROR_CODES } from '../../protocol/errors.js';
import type { EnvironmentServer } from '../../servers/environment/module.js';
import { httpJson } from '../helpers/http.js';
import { family, histogram, labelValues, type Scrape, scrape, value } from '../helpers/prometheus.js';
import { tempDir } from '../helpers/temp-dir.js';
import { waitFor } from '../helpers/wait.js';
import { chat, closeFixtures, startModel, weatherStart } from './model-fixtures.js';
import { AUTH, closeAll, type FakeServer, runBody, startEnvironment, startFakeAgent, startFakeResources, TOKEN } from './environment-fakes.js';

const apps: FastifyInstance[] = [];
const http = new Agent();
let agent: FakeServer;
let resources: FakeServer;

beforeAll(async () => {
  agent = await startFakeAgent();
  resources = await startFakeResources({ verify: 'wait' });
  apps.push(agent.app, resources.app);
});

afterAll(async () => {
  agent.releaseAll();
  await closeFixtures();
  await http.close();
  await closeAll(apps);
});

/** A real environment server on a free port. */
async function listening(): Promise<{ e: EnvironmentServer; url: string }> {
  const e = await startEnvironment(agent, resources);
  apps.push(e.app);
  await e.app.listen({ host: '127.0.0.1', port: 0 });
  return { e, url: `http://127.0.0.1:${(e.app.server.address() as { port: number }).port}` };
}

const soon = (s = 10): number => Date.now() / 1000 + s;
const ROLLOUT = 'metrics-rollout-17';
const ep = { rollout_id: ROLLOUT, attempt: 0 };

function control(url: string, op: string, body: Record<string, unknown>, headers: Record<string, string> = AUTH) {
  return httpJson(http, 'POST', `${url}${CONTROL_PREFIX}/${op}`, body, headers);
}

async function metrics(url: string): Promise<Scrape> {
  const s = await scrape(http, url);
  expect(s.status).toBe(200);
  expect(s.contentType).toMatch(/^text\/plain; version=0\.0\.4/);
  return s;
}

function phases(s: Scrape): Record<string, number> {
  return Object.fromEntries(family(s, 'gym_control_phase', 'gauge').samples.map((m) => [m.labels.phase!, m.value]));
}

describe('/metrics', () => {
  it('tracks phase, durations, admission, records and refusals through prepare / commit / resume and a restore', async () => {
    const { e, url } = await listening();

    // Scraped without the token (the control routes would answer 401), before anything happened.
    const start = await metrics(url);
    expect(phases(start)).toEqual({ idle: 1, preparing: 0, prepared: 0, committed: 0, restored: 0 });
    const refusals = family(start, 'gym_refusals_total', 'counter');
    expect(refusals.samples.map((m) => Object.keys(m.labels))).toEqual(ERROR_CODES.map(() => ['code']));
    expect(refusals.samples.map((m) => m.labels.code).sort()).toEqual([...ERROR_CODES].sort());
    expect(refusals.samples.every((m) => m.value === 0)).toBe(true);
    const durations = family(start, 'gym_control_operation_duration_seconds', 'histogram');
    const seriesLabels = new Set(durations.samples.map((m) => JSON.stringify(Object.keys(m.labels).filter((l) => l !== 'le'))));
    expect([...seriesLabels]).toEqual(['["operation"]']);
    expect([...new Set(durations.samples.map((m) => m.labels.operation))].sort()).toEqual(['commit', 'prepare', 'restore', 'resume']);
    for (const op of ['prepare', 'commit', 'restore', 'resume'])
      expect(histogram(start, 'gym_control_operation_duration_seconds', { operation: op }).count).toBe(0);
    expect(histogram(start, 'gym_admission_closed_seconds').count).toBe(0);
    expect(value(start, 'gym_records_exported_total', 'counter')).toBe(0);
    expect(value(start, 'gym_records_restored_total', 'counter')).toBe(0);
    expect(value(start, 'gym_episodes_in_flight', 'gauge')).toBe(0);
    expect(value(start, 'gym_episodes_parked', 'gauge')).toBe(0);
    expect(start.families.has('gym_model_calls_held')).toBe(false);
    // Node's process metrics, in the same registry.
    family(start, 'process_cpu_user_seconds_total', 'counter');

    // Refusals through both error handlers: the control plugin's (401 without the token) and the app's (400).
    expect((await control(url, 'prepare', { checkpoint_id: 'ck-1', deadline_ts: soon() }, {})).status).toBe(401);
    expect((await httpJson(http, 'POST', `${url}/run`, { episode_id: ep })).status).toBe(400);

    // One episode in flight, parked at a boundary once the checkpoint closes admission.
    agent.hold('activation');
    const run = httpJson(http, 'POST', `${url}/run`, runBody(ROLLOUT));
    await waitFor(() => agent.count('activation', ROLLOUT) === 1);
    expect(value(await metrics(url), 'gym_episodes_in_flight', 'gauge')).toBe(1);
    const prep = await control(url, 'prepare', { checkpoint_id: 'ck-1', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    agent.release('activation');
    await waitFor(() => e.participant.steps.stateOf(ROLLOUT) === 'parked');

    // A fencing refusal (409): another checkpoint while ck-1 is open. It did no work: not timed.
    const conflict = await control(url, 'prepare', { checkpoint_id: 'ck-other', deadline_ts: soon() });
    expect(conflict.status).toBe(409);
    expect(conflict.body.error.code).toBe('checkpoint_conflict');

    const prepared = await metrics(url);
    expect(phases(prepared)).toEqual({ idle: 0, preparing: 0, prepared: 1, committed: 0, restored: 0 });
    expect(value(prepared, 'gym_episodes_in_flight', 'gauge')).toBe(1);
    expect(value(prepared, 'gym_episodes_parked', 'gauge')).toBe(1);
    expect(value(prepared, 'gym_refusals_total', 'counter', { code: 'unauthorized' })).toBe(1);
    expect(value(prepared, 'gym_refusals_total', 'counter', { code: 'invalid_request' })).toBe(1);
    expect(value(prepared, 'gym_refusals_total', 'counter', { code: 'checkpoint_conflict' })).toBe(1);
    expect(value(prepared, 'gym_refusals_total', 'counter', { code: 'invalid_phase' })).toBe(0);
    expect(histogram(prepared, 'gym_control_operation_duration_seconds', { operation: 'prepare' }).count).toBe(1);
    expect(histogram(prepared, 'gym_admission_closed_seconds').count).toBe(0);

    const dir = tempDir('metrics-ckpt', 'file');
    const commit = await control(url, 'commit', { checkpoint_id: 'ck-1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep] });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
    // A replay of the same commit returns the kept reply: not timed, not counted again.
    expect((await control(url, 'commit', { checkpoint_id: 'ck-1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep] })).status).toBe(200);
    const committed = await metrics(url);
    expect(phases(committed).committed).toBe(1);
    expect(histogram(committed, 'gym_control_operation_duration_seconds', { operation: 'commit' }).count).toBe(1);
    expect(histogram(committed, 'gym_control_operation_duration_seconds', { operation: 'commit' }).sum).toBeGreaterThan(0);
    expect(value(committed, 'gym_records_exported_total', 'counter')).toBe(1);

    expect((await control(url, 'resume', { checkpoint_id: 'ck-1', deadline_ts: soon() })).body).toEqual({ phase: 'idle', idempotent: false });
    expect((await run).body.result.reward).toBe(1);
    // The episode ends after its reply.
    await waitFor(async () => value(await metrics(url), 'gym_episodes_in_flight', 'gauge') === 0);
    const resumed = await metrics(url);
    expect(phases(resumed)).toEqual({ idle: 1, preparing: 0, prepared: 0, committed: 0, restored: 0 });
    expect(histogram(resumed, 'gym_control_operation_duration_seconds', { operation: 'resume' }).count).toBe(1);
    expect(histogram(resumed, 'gym_admission_closed_seconds').count).toBe(1);
    expect(value(resumed, 'gym_episodes_in_flight', 'gauge')).toBe(0);
    expect(value(resumed, 'gym_episodes_parked', 'gauge')).toBe(0);
    expect(histogram(resumed, 'gym_control_operation_duration_seconds', { operation: 'restore' }).count).toBe(0);

    // A fresh process restores the episode: its own registry, starting from zero.
    const fresh = await listening();
    const restore = await control(fresh.url, 'restore', { checkpoint_id: 'rs-1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep] });
    expect(restore.body).toMatchObject({ phase: 'restored', restored: [`${ROLLOUT}-a1`] });
    const restored = await metrics(fresh.url);
    expect(phases(restored).restored).toBe(1);
    expect(value(restored, 'gym_records_restored_total', 'counter')).toBe(1);
    expect(histogram(restored, 'gym_control_operation_duration_seconds', { operation: 'restore' }).count).toBe(1);
    expect(histogram(restored, 'gym_control_operation_duration_seconds', { operation: 'commit' }).count).toBe(0);
    expect(value(restored, 'gym_refusals_total', 'counter', { code: 'unauthorized' })).toBe(0);
    await control(fresh.url, 'resume', { checkpoint_id: 'rs-1', deadline_ts: soon() });
    expect(histogram(await metrics(fresh.url), 'gym_admission_closed_seconds').count).toBe(1);

    // No secret and no unbounded value anywhere: not in labels, not in the text at all.
    for (const s of [start, prepared, committed, resumed, restored]) {
      for (const v of labelValues(s)) {
        for (const secret of [TOKEN, ROLLOUT, 'ck-1', 'ck-other', 'rs-1', dir]) expect(v).not.toContain(secret);
      }
      for (const secret of [TOKEN, ROLLOUT, 'ck-1', 'rs-1']) expect(s.text).not.toContain(secret);
    }
  });

  it('counts the refusals route handlers send themselves: an environment /run and a model proxy call', async () => {
    const { url } = await listening();

    // admission_closed: a new episode while a checkpoint holds admission.
    expect((await control(url, 'prepare', { checkpoint_id: 'ck-run', deadline_ts: soon() })).body.phase).toBe('prepared');
    const closed = await httpJson(http, 'POST', `${url}/run`, runBody('metrics-late'));
    expect([closed.status, closed.body.error?.code]).toEqual([409, 'admission_closed']);
    await control(url, 'resume', { checkpoint_id: 'ck-run', deadline_ts: soon() });

    // stale_attempt: the reply of a running attempt that a retire stopped.
    agent.hold('activation');
    const running = httpJson(http, 'POST', `${url}/run`, runBody('metrics-retired'));
    await waitFor(() => agent.count('activation', 'metrics-retired') === 1);
    await control(url, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [{ rollout_id: 'metrics-retired', attempt: 0 }] });
    const stale = await running;
    agent.release('activation');
    expect([stale.status, stale.body.error?.code]).toEqual([409, 'stale_attempt']);

    const env = await metrics(url);
    expect(value(env, 'gym_refusals_total', 'counter', { code: 'admission_closed' })).toBe(1);
    expect(value(env, 'gym_refusals_total', 'counter', { code: 'stale_attempt' })).toBe(1);

    // backend_unavailable: sent by the model proxy itself when its backend does not answer.
    const model = await startModel({ url: 'http://127.0.0.1:9' });
    const failed = await chat(model, 'metrics-model-a0', weatherStart());
    expect([failed.status, failed.body.error?.code]).toEqual([502, 'backend_unavailable']);
    const m = await metrics(model.url);
    expect(value(m, 'gym_refusals_total', 'counter', { code: 'backend_unavailable' })).toBe(1);
    expect(family(m, 'gym_refusals_total', 'counter').samples.reduce((n, x) => n + x.value, 0)).toBe(1);
  });

  it('a server without a control plane serves its refusals only, from a registry of its own', async () => {
    const s = await metrics(agent.url);
    expect(s.families.has('gym_control_phase')).toBe(false);
    expect(s.families.has('gym_episodes_in_flight')).toBe(false);
    expect(family(s, 'gym_refusals_total', 'counter').samples.every((m) => m.value === 0)).toBe(true);
    // The token is never asked for, and a wrong one changes nothing.
    expect((await scrape(http, agent.url, { authorization: 'Bearer wrong' })).status).toBe(200);
  });
});
