// The resources base (participants.md §4.2–4.6) through the weather and counter servers, with
// checkpointing on and the control routes driven over inject (and one real socket).
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../servers/common/config-error.js';
import { SESSION_COOKIE, verifySession } from '../../servers/common/session-cookie.js';
import { DeferredJson, materialized } from '../../protocol/deferred-json.js';
import { resourcesParticipantOf } from '../../servers/resources/base.js';
import { ResourcesParticipant } from '../../servers/resources/participant.js';
import * as counterMod from '../../servers/resources/counter.js';
import * as genrmMod from '../../servers/resources/genrm-compare.js';
import * as weatherMod from '../../servers/resources/weather.js';
import { weatherDescription, weatherReward } from '../../servers/resources/weather.js';
import { buildServer, Client, contextFor, control, ep, SECRET, settlesWithin, soon } from './resources-helpers.js';
import { sleep, waitFor } from '../helpers/wait.js';
import { tempDir } from '../helpers/temp-dir.js';

const apps: FastifyInstance[] = [];

afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

async function weather(options: Record<string, unknown> = {}, name = 'weather', checkpoint = true): Promise<FastifyInstance> {
  const app = await buildServer(weatherMod, name, 'weather', options, { checkpoint });
  apps.push(app);
  return app;
}

async function counter(name = 'counter', options: Record<string, unknown> = {}): Promise<FastifyInstance> {
  const app = await buildServer(counterMod, name, 'counter', options);
  apps.push(app);
  return app;
}

/** Servers live as long as the file: so do their directories. */
const checkpointDir = (): string => tempDir('resources-test', 'file');

const nativeSeed = (sid: string, rollout: string, extra: Record<string, unknown> = {}) => ({
  resources_session_id: sid,
  episode_id: { rollout_id: rollout, attempt: 0 },
  task_id: { taskset: 't', task_id: rollout },
  task_data: {},
  ...extra,
});

async function status(app: FastifyInstance): Promise<any> {
  const r = await control(app, 'status');
  expect(r.status).toBe(200);
  return r.body;
}

describe('startup validation', () => {
  it('names servers.<name>.options.checkpoint_mode for an unknown mode', () => {
    for (const mod of [weatherMod, counterMod, genrmMod]) {
      let err: unknown;
      try {
        parseConfig(mod.default.optionsSchema, { checkpoint_mode: 'statless' }, 'servers.res.options');
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).key).toBe('servers.res.options.checkpoint_mode');
    }
  });

  it('names checkpoint_verify for an unknown verify value and rejects unknown keys', () => {
    expect(() => parseConfig(weatherMod.default.optionsSchema, { checkpoint_verify: 'later' }, 'servers.weather.options')).toThrow(
      /servers\.weather\.options\.checkpoint_verify/,
    );
    expect(() => parseConfig(weatherMod.default.optionsSchema, { checkpoint_modes: 'stateless' }, 'servers.weather.options')).toThrow(
      /servers\.weather\.options\.checkpoint_modes/,
    );
  });

  it('fills the declared defaults', () => {
    expect(weatherMod.default.optionsSchema.parse({})).toMatchObject({ checkpoint_mode: 'stateless', checkpoint_verify: 'replay', verify_delay_ms: 0 });
    expect(counterMod.default.optionsSchema.parse({})).toMatchObject({ checkpoint_mode: 'exported', checkpoint_verify: 'wait' });
    expect(genrmMod.default.optionsSchema.parse({})).toMatchObject({ checkpoint_mode: 'stateless', checkpoint_verify: 'replay' });
  });

  it('fails an exported server without session hooks, even with checkpointing off', async () => {
    for (const checkpoint of [true, false]) {
      const ctx = contextFor('w', 'weather', { checkpoint });
      const opts = weatherMod.default.optionsSchema.parse({ checkpoint_mode: 'exported' });
      await expect(weatherMod.default.build(ctx, opts)).rejects.toThrow(ConfigError);
      await expect(weatherMod.default.build(ctx, opts)).rejects.toThrow(/servers\.w\.options\.checkpoint_mode/);
    }
  });

  it('refuses a genrm_compare verify that would wait', () => {
    expect(() => parseConfig(genrmMod.default.optionsSchema, { checkpoint_verify: 'wait' }, 'servers.genrm.options')).toThrow(
      /servers\.genrm\.options\.checkpoint_verify/,
    );
  });
});

describe('sessions and seed replies', () => {
  it('sends x-ng-checkpoint-verify per server and the restart header only when restart-only', async () => {
    const cases: Array<[FastifyInstance, string, string | undefined]> = [
      [await weather(), 'replay', undefined],
      [await weather({ checkpoint_mode: 'restart_only', checkpoint_verify: 'wait' }), 'wait', '1'],
      [await counter(), 'wait', undefined],
    ];
    for (const [app, verify, restart] of cases) {
      const r = await new Client(app).post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
      expect(r.status).toBe(200);
      expect(r.headers['x-ng-checkpoint-verify']).toBe(verify);
      expect(r.headers['x-ng-checkpoint-restart']).toBe(restart);
      expect(r.body).toEqual({ resources_session_id: 's1', resources_tools: null, sandbox_access: null });
    }
  });

  it('with checkpointing off: no headers, no control routes, sessions still work', async () => {
    const app = await weather({}, 'weather-off', false);
    const c = new Client(app);
    const r = await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    expect(r.status).toBe(200);
    expect(r.headers['x-ng-checkpoint-verify']).toBeUndefined();
    expect(verifySession(SECRET, c.cookies[SESSION_COOKIE])).toEqual({ session_id: 's1' });
    expect((await control(app, 'status')).status).toBe(404);
    expect(resourcesParticipantOf(app)).toBeUndefined();
  });

  it('mints a signed session on first contact and replaces it with the ID a native seed names', async () => {
    const app = await weather();
    const c = new Client(app);
    const first = await c.post('/get_weather', { city: 'SF' });
    expect(first.body).toEqual({ city: 'SF', weather_description: 'The weather in SF is cold.' });
    const minted = verifySession(SECRET, c.cookies[SESSION_COOKIE])?.session_id;
    expect(typeof minted).toBe('string');
    // The same cookie keeps its ID (no new cookie).
    const again = await c.post('/get_weather', { city: 'SF' });
    expect(again.headers['set-cookie']).toBeUndefined();
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('named-1', 'r1'));
    expect(verifySession(SECRET, c.cookies[SESSION_COOKIE])).toEqual({ session_id: 'named-1' });
    // A seed reply always carries the cookie, even when the caller already sent it.
    const reseed = await c.post('/ng-rollout/r1/seed_session', nativeSeed('named-1', 'r1'));
    expect(String(reseed.headers['set-cookie'])).toMatch(/^session=/);
    // A legacy seed (no resources_session_id) gets `{}` and is still tracked under the cookie ID.
    const legacy = await new Client(app).post('/ng-rollout/r2/seed_session', { some: 'row' });
    expect(legacy.body).toEqual({});
    expect((await status(app)).report.counts.sessions).toBe(2);
  });

  it('does not track a seed without a rollout prefix', async () => {
    const app = await weather();
    await new Client(app).post('/seed_session', nativeSeed('s1', 'r1'));
    expect((await status(app)).report.counts.sessions).toBe(0);
  });

  it('weather validates native seeds and close', async () => {
    const app = await weather();
    const c = new Client(app);
    expect((await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'))).status).toBe(200);
    // The same episode seeding again (a replayed seed) is fine; another episode is not.
    expect((await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'))).status).toBe(200);
    expect((await new Client(app).post('/ng-rollout/r9/seed_session', nativeSeed('s1', 'r9'))).status).toBe(409);
    expect((await c.post('/ng-rollout/r1/close_session', { resources_session_id: 's1', episode_id: ep('r9') })).status).toBe(409);
    expect((await c.post('/ng-rollout/r1/close_session', { resources_session_id: 's1', episode_id: ep('r1') })).body).toEqual({ resources_session_id: 's1' });
    expect((await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'))).status).toBe(409);
    expect((await c.post('/get_weather', { town: 'x' })).status).toBe(400);
  });
});

describe('weather', () => {
  it('describes weather deterministically', () => {
    expect(weatherDescription('Paris')).toBe(weatherDescription('Paris'));
    expect(weatherDescription('SF')).toBe('The weather in SF is cold.');
  });

  it('rewards a get_weather call with the task city only', () => {
    const call = (name: string, args: unknown) => ({
      type: 'function_call',
      call_id: 'c1',
      name,
      arguments: typeof args === 'string' ? args : JSON.stringify(args),
    });
    const body = (output: unknown[], city = 'SF') => ({ city, response: { output } });
    expect(weatherReward(body([call('get_weather', { city: 'SF' })]))).toBe(1);
    expect(weatherReward({ task_data: { city: 'SF' }, response: { output: [call('get_weather', { city: 'SF' })] } })).toBe(1);
    expect(weatherReward(body([call('get_weather', { city: 'LA' })]))).toBe(0);
    expect(weatherReward(body([call('get_time', { city: 'SF' })]))).toBe(0);
    expect(weatherReward(body([call('get_weather', '{not json')]))).toBe(0);
    expect(weatherReward(body([{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'SF' }] }]))).toBe(0);
  });

  it('verify echoes the body with reward and mask_sample', async () => {
    const app = await weather();
    const c = new Client(app);
    const body = {
      responses_create_params: { input: [] },
      response: { output: [{ type: 'function_call', call_id: 'c', name: 'get_weather', arguments: '{"city":"SF"}' }] },
      city: 'SF',
    };
    const r = await c.post('/ng-rollout/r1/verify', body);
    expect(r.body).toEqual({ ...body, reward: 1, mask_sample: false });
  });
});

describe('admission while a checkpoint is open', () => {
  it('a tool call waits for resume, then proceeds', async () => {
    const app = await counter();
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1', { task_data: { initial_count: 3 } }));
    const prep = await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    const inc = c.post('/ng-rollout/r1/increment_counter', { count: 2 });
    expect(await settlesWithin(inc, 100)).toBe(false);
    // A waiting request is not in flight: it does not block the checkpoint.
    expect((await status(app)).report).toMatchObject({ ready: true, counts: { inflight: 0, sessions: 1 } });
    expect((await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() })).status).toBe(200);
    expect((await inc).body).toEqual({ success: true });
    expect((await c.post('/ng-rollout/r1/get_counter_value')).body).toEqual({ count: 5 });
  });

  it('a seed waits even on a restart-only server, while its tool calls keep flowing', async () => {
    const app = await weather({ checkpoint_mode: 'restart_only', checkpoint_verify: 'wait', verify_delay_ms: 300 });
    const a = new Client(app);
    await a.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    // A slow verify in flight never blocks a restart-only server.
    const slow = a.post('/ng-rollout/r1/verify', { city: 'SF', response: { output: [] } }, { 'x-ng-checkpoint-close-follows': '1' });
    await waitFor(async () => (await status(app)).report.counts.inflight === 1);
    const prep = await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    expect(prep.body.report.restarts).toEqual(['r1']);
    expect(prep.body.report.ready).toBe(true);
    const tool = await a.post('/ng-rollout/r1/get_weather', { city: 'SF' });
    expect(tool.status).toBe(200);
    const seed = new Client(app).post('/ng-rollout/r2/seed_session', nativeSeed('s2', 'r2'));
    expect(await settlesWithin(seed, 100)).toBe(false);
    await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect((await seed).headers['x-ng-checkpoint-restart']).toBe('1');
    expect((await slow).status).toBe(200);
    expect((await status(app)).report.restarts).toEqual(['r1', 'r2']);
  });

  it('a replayable verify is admitted at once and its session is ended only at resume', async () => {
    const app = await weather();
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon() });
    const v = c.post('/ng-rollout/r1/verify', { city: 'SF', response: { output: [] } });
    expect(await settlesWithin(v, 200)).toBe(true);
    expect((await v).body.reward).toBe(0);
    // Still tracked while the checkpoint is open (it would be exported; a restore re-runs the verify).
    expect((await status(app)).report.counts.sessions).toBe(1);
    await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect((await status(app)).report.counts.sessions).toBe(0);
  });

  it('a replayable verify in flight does not block prepare', async () => {
    const app = await weather({ verify_delay_ms: 300 });
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    const v = c.post('/ng-rollout/r1/verify', { city: 'SF', response: { output: [] } });
    await sleep(20);
    const prep = await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    expect(prep.body.report.counts.inflight).toBe(0);
    await v;
    await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() });
  });
});

describe('readiness', () => {
  it('prepare waits for an in-flight wait-mode verify: not ready with inflight 1, then prepared', async () => {
    const app = await weather({ checkpoint_verify: 'wait', verify_delay_ms: 400 });
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    const v = c.post('/ng-rollout/r1/verify', { city: 'SF', response: { output: [] } });
    await waitFor(async () => (await status(app)).report.counts.inflight === 1);
    const early = await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon(0.1) });
    expect(early.status).toBe(200);
    expect(early.body.phase).toBe('preparing');
    expect(early.body.report).toMatchObject({ ready: false, blockers: [], counts: { inflight: 1, sessions: 1 } });
    // The same checkpoint again: prepare waits for the verify (woken by its end) and is ready.
    const t0 = Date.now();
    const later = await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon(5) });
    expect(later.body.phase).toBe('prepared');
    expect(later.body.report).toMatchObject({ ready: true, counts: { inflight: 0, sessions: 0 } });
    expect(Date.now() - t0).toBeLessThan(2000);
    expect((await v).status).toBe(200);
    await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() });
  });

  it('reports kind resources and the status extras', async () => {
    const app = await counter();
    const s = await status(app);
    expect(s).toMatchObject({ kind: 'resources', instance: 'counter', phase: 'idle', mode: 'exported', verify: 'wait', retired_sessions: 0 });
  });

  it('a client that disconnects does not leak its in-flight count', async () => {
    const app = await weather({ checkpoint_verify: 'wait', verify_delay_ms: 2000 }, 'weather-socket');
    await app.listen({ host: '127.0.0.1', port: 0 });
    const port = (app.server.address() as AddressInfo).port;
    const req = httpRequest({
      host: '127.0.0.1',
      port,
      method: 'POST',
      path: '/ng-rollout/r1/verify',
      headers: { 'content-type': 'application/json' },
      agent: false,
    });
    req.on('error', () => undefined);
    req.end(JSON.stringify({ city: 'SF', response: { output: [] } }));
    await waitFor(async () => (await status(app)).report.counts.inflight === 1);
    req.destroy();
    await waitFor(async () => (await status(app)).report.counts.inflight === 0, 1000);
    // A normal keep-alive exchange over the socket releases its count too.
    const res = await fetch(`http://127.0.0.1:${port}/ng-rollout/r2/get_weather`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ city: 'SF' }),
    });
    expect(res.status).toBe(200);
    await res.text();
    await waitFor(async () => (await status(app)).report.counts.inflight === 0, 1000);
  });
});

describe('counter export and restore', () => {
  async function runToCheckpoint(dir: string): Promise<Client> {
    const app = await counter('counter');
    const c = new Client(app);
    const seed = await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1', { task_data: { initial_count: 3, expected_count: 6 } }));
    expect(seed.status).toBe(200);
    expect((await c.post('/ng-rollout/r1/increment_counter', { count: 1 })).body).toEqual({ success: true });
    expect((await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon() })).body.phase).toBe('prepared');
    const commit = await control(app, 'commit', { checkpoint_id: 'ck1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(commit.status).toBe(200);
    expect(commit.body.episode_ids).toEqual(['r1']);
    expect(commit.body.manifest.record_count).toBe(1);
    await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() });
    // A process that served sessions is no restore target.
    const again = await control(app, 'restore', { checkpoint_id: 'ck-r', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe('checkpoint_error');
    return c;
  }

  it('the replacement continues from the restored count (reward 1.0); without restore it cannot (0.0)', async () => {
    const dir = checkpointDir();
    const original = await runToCheckpoint(dir);

    // "Crash": a fresh process of the same instance, restored from the checkpoint.
    const fresh = await counter('counter');
    const restore = await control(fresh, 'restore', { checkpoint_id: 'ck-restore', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(restore.status).toBe(200);
    expect(restore.body).toMatchObject({ phase: 'restored', source_checkpoint_id: 'ck1', restored: ['r1-a1'] });
    const replacement = new Client(fresh);
    replacement.cookies = { ...original.cookies };
    // After restore, requests wait for resume.
    const inc = replacement.post('/ng-rollout/r1-a1/increment_counter', { count: 2 });
    expect(await settlesWithin(inc, 100)).toBe(false);
    await control(fresh, 'resume', { checkpoint_id: 'ck-restore', deadline_ts: soon() });
    expect((await inc).status).toBe(200);
    const v = await replacement.post('/ng-rollout/r1-a1/verify', { expected_count: 6, response: { output: [] } });
    expect(v.body.reward).toBe(1);

    // Negative control: a fresh process without the restore.
    const bare = await counter('counter');
    const lost = new Client(bare);
    lost.cookies = { ...original.cookies };
    await lost.post('/ng-rollout/r1-a1/increment_counter', { count: 2 });
    expect((await lost.post('/ng-rollout/r1-a1/verify', { expected_count: 6, response: { output: [] } })).body.reward).toBe(0);
  });

  it('the restore marks the crashed attempt: its stragglers get stale_attempt', async () => {
    const dir = checkpointDir();
    const original = await runToCheckpoint(dir);
    const fresh = await counter('counter');
    await control(fresh, 'restore', { checkpoint_id: 'ck-restore', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    await control(fresh, 'resume', { checkpoint_id: 'ck-restore', deadline_ts: soon() });
    const straggler = new Client(fresh);
    straggler.cookies = { ...original.cookies };
    const r = await straggler.post('/ng-rollout/r1/increment_counter', { count: 1 });
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('stale_attempt');
  });

  it('a restored session the next commit scope leaves out is freed (unscoped restored cleanup)', async () => {
    const dir = checkpointDir();
    await runToCheckpoint(dir);
    const fresh = await counter('counter');
    await control(fresh, 'restore', { checkpoint_id: 'ck-restore', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    await control(fresh, 'resume', { checkpoint_id: 'ck-restore', deadline_ts: soon() });
    expect((await status(fresh)).report.counts.sessions).toBe(1);
    const dir2 = checkpointDir();
    await control(fresh, 'prepare', { checkpoint_id: 'ck2', deadline_ts: soon() });
    const commit = await control(fresh, 'commit', { checkpoint_id: 'ck2', deadline_ts: soon(), checkpoint_dir: dir2, episode_ids: [] });
    expect(commit.body.episode_ids).toEqual([]);
    expect((await status(fresh)).report.counts.sessions).toBe(0);
    await control(fresh, 'resume', { checkpoint_id: 'ck2', deadline_ts: soon() });
  });

  it('a restored unclaimed session is exported again under its replacement attempt', async () => {
    const dir = checkpointDir();
    await runToCheckpoint(dir);
    const fresh = await counter('counter');
    await control(fresh, 'restore', { checkpoint_id: 'ck-restore', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    await control(fresh, 'resume', { checkpoint_id: 'ck-restore', deadline_ts: soon() });
    await control(fresh, 'prepare', { checkpoint_id: 'ck2', deadline_ts: soon() });
    const commit = await control(fresh, 'commit', { checkpoint_id: 'ck2', deadline_ts: soon(), checkpoint_dir: checkpointDir(), episode_ids: [ep('r1', 1)] });
    expect(commit.body.episode_ids).toEqual(['r1-a1']);
    await control(fresh, 'resume', { checkpoint_id: 'ck2', deadline_ts: soon() });
  });

  it('refuses records on a non-exported server and invalid states (nothing installed)', async () => {
    const dir = checkpointDir();
    await runToCheckpoint(dir);
    // The same instance name declared stateless cannot take the counter's records.
    const stateless = await counter('counter', { checkpoint_mode: 'stateless' });
    const r = await control(stateless, 'restore', { checkpoint_id: 'ck-restore', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('checkpoint_error');
  });
});

describe('retire and forget', () => {
  it('refuses later requests of a retired attempt and its sessions; close is never refused', async () => {
    const app = await counter();
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1', { initial_count: 1 }));
    const other = new Client(app);
    await other.post('/ng-rollout/r2/seed_session', nativeSeed('s2', 'r2', { initial_count: 1 }));
    const retire = await control(app, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1')] });
    expect(retire.body).toEqual({ retired_count: 1 });
    for (const path of ['/ng-rollout/r1/increment_counter', '/ng-rollout/r1-a1/increment_counter', '/increment_counter']) {
      const r = await c.post(path, { count: 1 });
      expect(r.status, path).toBe(409);
      expect(r.body.error.code).toBe('stale_attempt');
    }
    // A new seed of the retired attempt is refused; the next attempt with a new session is not.
    expect((await new Client(app).post('/ng-rollout/r1/seed_session', nativeSeed('s9', 'r1'))).body.error.code).toBe('stale_attempt');
    expect((await new Client(app).post('/ng-rollout/r1-a1/seed_session', nativeSeed('s3', 'r1'))).status).toBe(200);
    expect((await c.post('/ng-rollout/r1/close_session', {})).status).toBe(200);
    // The other rollout is untouched.
    expect((await other.post('/ng-rollout/r2/increment_counter', { count: 1 })).status).toBe(200);
    expect(await status(app)).toMatchObject({ retired_rollouts: 1, retired_sessions: 1, report: { counts: { sessions: 2 } } });
    const forget = await control(app, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] });
    expect(forget.body).toEqual({ forgotten_count: 1 });
    expect(await status(app)).toMatchObject({ retired_rollouts: 0, retired_sessions: 0 });
  });

  it('a retire cut short leaves the session tracked and blocking; forget is retire_incomplete until it is freed', async () => {
    const app = await weather({ checkpoint_verify: 'wait', verify_delay_ms: 500 });
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    const v = c.post('/ng-rollout/r1/verify', { city: 'SF', response: { output: [] } }, { 'x-ng-checkpoint-close-follows': '1' });
    await waitFor(async () => (await status(app)).report.counts.inflight === 1);
    const retire = await control(app, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(0.1), episode_ids: [ep('r1')] });
    expect(retire.status).toBe(409);
    expect(retire.body.error.code).toBe('deadline_exceeded');
    expect((await status(app)).report).toMatchObject({ ready: false, blockers: ['r1'], blocker_count: 1 });
    const forget = await control(app, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] });
    expect(forget.status).toBe(409);
    expect(forget.body.error.code).toBe('retire_incomplete');
    // The verify admitted before the retire finishes; a retried retire frees the session.
    expect((await v).status).toBe(200);
    expect((await control(app, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1')] })).status).toBe(200);
    expect((await status(app)).report).toMatchObject({ ready: true, blockers: [], counts: { sessions: 0 } });
    expect((await control(app, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] })).status).toBe(200);
  });

  it('retire frees exported state through the hook', async () => {
    const app = await counter();
    const c = new Client(app);
    await c.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1', { initial_count: 4 }));
    await control(app, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1', 3)] });
    await control(app, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] });
    // After forget the session ID is usable again and its counter is gone.
    expect((await c.post('/ng-rollout/r1-a4/get_counter_value')).body).toEqual({ count: 0 });
  });
});

describe('end of a session', () => {
  it('verify ends it unless x-ng-checkpoint-close-follows: 1; close_session ends it', async () => {
    const app = await weather({ checkpoint_verify: 'wait' });
    const a = new Client(app);
    await a.post('/ng-rollout/r1/seed_session', nativeSeed('s1', 'r1'));
    await a.post('/ng-rollout/r1/verify', { city: 'SF', response: { output: [] } }, { 'x-ng-checkpoint-close-follows': '1' });
    expect((await status(app)).report.counts.sessions).toBe(1);
    await a.post('/ng-rollout/r1/close_session', { resources_session_id: 's1', episode_id: ep('r1') });
    expect((await status(app)).report.counts.sessions).toBe(0);

    const b = new Client(app);
    await b.post('/ng-rollout/r2/seed_session', nativeSeed('s2', 'r2'));
    await b.post('/ng-rollout/r2/verify', { city: 'SF', response: { output: [] } }, { 'x-ng-checkpoint-close-follows': 'yes' });
    expect((await status(app)).report.counts.sessions).toBe(0);
  });
});

describe('restored session states, deferred or parsed', () => {
  const line = Buffer.from('{"episode_id":{"rollout_id":"r1","attempt":0},"session_id":"s1","state":{"count":2}}');
  it.each([false, true])('deferredStates %s: the hooks get DeferredJson only when they take it', async (deferredStates) => {
    const got = new Map<string, unknown>();
    const p = new ResourcesParticipant({
      mode: 'exported',
      verify: 'wait',
      stateHooks: {
        deferredStates,
        exportSessionStates: () => new Map(),
        restoreSessionStates: (states) => {
          for (const [k, v] of states) got.set(k, v);
        },
        retireSessionState: () => undefined,
      },
    });
    expect(p.deferredRecordField).toBe(deferredStates ? 'state' : undefined);
    const record = { episode_id: { rollout_id: 'r1', attempt: 0 }, session_id: 's1', state: new DeferredJson(line, 'state') };
    const manifest = {
      schema_version: 1,
      kind: 'resources',
      instance: 'x',
      checkpoint_id: 'c',
      records_file: 'records.jsonl',
      records_sha256: '0'.repeat(64),
      record_count: 1,
    } as const;
    expect(await p.install({ records: [record], scope: [record.episode_id], manifest })).toEqual(['r1-a1']);
    const state = got.get('s1');
    if (deferredStates) expect(state).toBeInstanceOf(DeferredJson);
    expect(materialized(state)).toEqual({ count: 2 });
  });
});
