import type { FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { ConfigError, parseConfig } from '../../servers/common/config-error.js';
import { readRecords } from '../../servers/control/storage/reader.js';
import environmentModule, { EnvironmentOptionsSchema, type EnvironmentServer } from '../../servers/environment/module.js';
import {
  AUTH,
  closeAll,
  envContext,
  OBSERVATIONS,
  RESPONSE,
  runBody,
  startEnvironment,
  startFakeAgent,
  startFakeResources,
  task,
  type FakeServer,
} from './environment-fakes.js';
import { sleep, waitFor } from '../helpers/wait.js';
import { tempDir } from '../helpers/temp-dir.js';

const apps: FastifyInstance[] = [];
let agent: FakeServer;
let resources: FakeServer;

afterEach(async () => {
  agent?.releaseAll();
  resources?.releaseAll();
});

afterAll(async () => {
  await closeAll(apps);
});

async function fakes(opts: { verify?: 'wait' | 'replay' | null; restart?: boolean; agentRestart?: boolean } = {}): Promise<void> {
  agent = await startFakeAgent({ restart: opts.agentRestart });
  resources = await startFakeResources({ verify: opts.verify, restart: opts.restart });
  apps.push(agent.app, resources.app);
}

async function env(options: Record<string, unknown> = {}, checkpoint = true): Promise<EnvironmentServer> {
  const e = await startEnvironment(agent, resources, options, checkpoint);
  apps.push(e.app);
  return e;
}

/** Servers live as long as the file: so do their directories. */
const checkpointDir = (): string => tempDir('env-ckpt', 'file');

interface Reply {
  status: number;
  body: any;
}

async function run(e: EnvironmentServer, body: unknown): Promise<Reply> {
  const r = await e.app.inject({ method: 'POST', url: '/run', payload: body as object });
  return { status: r.statusCode, body: r.json() };
}

async function control(e: EnvironmentServer, op: string, body?: Record<string, unknown>): Promise<Reply> {
  const r = await e.app.inject({
    method: op === 'status' ? 'GET' : 'POST',
    url: `${CONTROL_PREFIX}/${op}`,
    headers: AUTH,
    ...(body ? { payload: body } : {}),
  });
  return { status: r.statusCode, body: r.json() };
}

const soon = (s = 5): number => Date.now() / 1000 + s;
const ep = (rollout_id: string, attempt = 0) => ({ rollout_id, attempt });

/** Tracks a promise's settlement without awaiting it. */
function track<T>(p: Promise<T>): { settled: () => boolean; value: () => T | undefined } {
  let settled = false;
  let value: T | undefined;
  void p.then((v) => {
    settled = true;
    value = v;
  });
  return { settled: () => settled, value: () => value };
}

async function commitAndRead(e: EnvironmentServer, id: string, scope: unknown[] | null = null): Promise<{ reply: Reply; records: any[]; dir: string }> {
  const dir = checkpointDir();
  const reply = await control(e, 'commit', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: dir, episode_ids: scope });
  expect(reply.status, JSON.stringify(reply.body)).toBe(200);
  const { records } = await readRecords({ checkpointDir: dir, kind: 'environment', instance: 'env', scope: null });
  return { reply, records, dir };
}

describe('/run: the stage protocol', () => {
  beforeEach(() => fakes({ verify: 'wait' }));

  it('runs seed → invoke → close → verify → cleanup and replies with the result', async () => {
    const e = await env();
    const r = await run(e, runBody('wx-17'));
    expect(r.status).toBe(200);
    expect(r.body.episode_id).toEqual({ rollout_id: 'wx-17', attempt: 0 });
    expect(r.body.task_id).toEqual({ taskset: 'weather', task_id: 'weather-SF' });
    expect(r.body.failure).toBeNull();
    expect(r.body.result).toMatchObject({
      reward: 1,
      mask_sample: false,
      ng_agent_observations: OBSERVATIONS,
      ng_trajectory: null,
      agent_timed_out: false,
      agent_timeout_seconds: null,
      response: RESPONSE,
      verified_by: 'fake',
      city: 'SF',
    });

    // Every call of the episode carries its capture key.
    const seed = resources.callsOf('seed_session')[0]!;
    expect(seed.key).toBe('wx-17');
    expect(seed.body.resources_session_id).toMatch(/^resources-session-[0-9a-f]{32}$/);
    expect(seed.body).toMatchObject({ episode_id: ep('wx-17'), task_id: task().task_id, task_data: { city: 'SF' } });
    const agentSeed = agent.callsOf('agent_seed')[0]!;
    expect(agentSeed.key).toBe('wx-17');
    expect(agentSeed.body.agent_session_id).toMatch(/^agent-session-[0-9a-f]{32}$/);
    expect(agentSeed.body.tool_accesses).toEqual([
      {
        kind: 'direct_http',
        name: 'weather.direct_http',
        required: true,
        base_url: `${resources.url}/ng-rollout/wx-17`,
        cookies: { session: `res-cookie-${seed.body.resources_session_id}` },
        headers: {},
      },
    ]);
    expect(agentSeed.body.sandbox_access).toBeNull();
    const activation = agent.callsOf('activation')[0]!;
    expect(activation.key).toBe('wx-17');
    expect(activation.headers['x-ng-agent-activation']).toBe('1');
    expect(activation.cookies).toEqual({ session: `agent-cookie-${agentSeed.body.agent_session_id}` });
    expect(activation.body).toEqual(task().task_input.responses_create_params);
    const close = agent.callsOf('agent_close')[0]!;
    expect(close.body).toEqual({ agent_session_id: agentSeed.body.agent_session_id, episode_id: ep('wx-17') });
    const verify = resources.callsOf('verify')[0]!;
    expect(verify.cookies).toEqual({ session: `res-cookie-${seed.body.resources_session_id}` });
    expect(verify.body).toEqual({ city: 'SF', responses_create_params: task().task_input.responses_create_params, response: RESPONSE });
    expect(resources.callsOf('close_session').map((c) => c.body)).toEqual([{ resources_session_id: seed.body.resources_session_id, episode_id: ep('wx-17') }]);
    expect(agent.count('agent_close')).toBe(1);

    const status = await control(e, 'status');
    expect(status.body).toMatchObject({ kind: 'environment', instance: 'env', report: { ready: true, counts: { episodes: 0 } }, restored_pending: [] });
  });

  it('works with checkpointing off (no control routes)', async () => {
    const e = await env({}, false);
    const r = await run(e, runBody('plain'));
    expect(r.body.result.reward).toBe(1);
    const s = await e.app.inject({ method: 'GET', url: `${CONTROL_PREFIX}/status`, headers: AUTH });
    expect(s.statusCode).toBe(404);
  });

  it('refuses a malformed body with 400 invalid_request', async () => {
    const e = await env();
    const r = await run(e, { episode_id: ep('x'), task: { ...task(), extra: 1 } });
    expect(r.status).toBe(400);
    expect(r.body.error.code).toBe('invalid_request');
    const bad = await run(e, { episode_id: { rollout_id: 'x-a1', attempt: 0 }, task: task() });
    expect(bad.status).toBe(400);
  });

  it('reports dependency failures as handled failures with the terminal flag rules', async () => {
    const e = await env();
    resources.failWith.set('seed_session', { status: 503, body: { error: 'busy' } });
    const retryable = await run(e, runBody('f1'));
    expect(retryable.status).toBe(200);
    expect(retryable.body.result).toBeNull();
    expect(retryable.body.failure).toMatchObject({ terminal: false, stage: 'seed' });
    expect(retryable.body.failure.failure_reason).toContain('503');
    // The resources session is closed even though its seed failed.
    expect(resources.count('close_session', 'f1')).toBe(1);

    resources.failWith.set('seed_session', { status: 400, body: { error: 'bad' } });
    const terminal = await run(e, runBody('f2'));
    expect(terminal.body.failure).toMatchObject({ terminal: true, stage: 'seed' });
    resources.failWith.delete('seed_session');

    // A failed activation closes the agent session at once: the failure carries its observations.
    agent.failWith.set('activation', { status: 500, body: 'boom' });
    const failedTurn = await run(e, runBody('f3'));
    expect(failedTurn.body.failure).toMatchObject({ terminal: false, stage: 'agent', ng_agent_observations: OBSERVATIONS, partial_response: null });
    expect(agent.count('agent_close', 'f3')).toBe(1);
    expect(resources.count('verify', 'f3')).toBe(0);
    agent.failWith.delete('activation');

    resources.failWith.set('verify', { status: 422, body: { detail: 'no' } });
    const verifyFailed = await run(e, runBody('f4'));
    expect(verifyFailed.body.failure).toMatchObject({ terminal: true, stage: 'verification', partial_response: RESPONSE });
    resources.failWith.delete('verify');

    agent.failWith.set('agent_close', { status: 502, body: 'down' });
    const closeFailed = await run(e, runBody('f5'));
    expect(closeFailed.body.failure).toMatchObject({ terminal: false, stage: 'cleanup', partial_response: RESPONSE });
    expect(closeFailed.body.failure.cleanup_error).toContain('502');
    // Final cleanup retried the agent close once more.
    expect(agent.count('agent_close', 'f5')).toBe(2);
  });

  it('a seed reply without a cookie or with another session ID is a terminal seed failure', async () => {
    const e = await env();
    resources.failWith.set('seed_session', { status: 200, body: { resources_session_id: 'resources-session-other' } });
    const r = await run(e, runBody('nocookie'));
    expect(r.body.failure).toMatchObject({ terminal: true, stage: 'seed', failure_reason: 'Resources seed did not establish a session cookie' });
  });

  it('the episode deadline gives a non-terminal "Episode timed out"', async () => {
    const e = await env({ default_episode_timeout_seconds: 0.2 });
    agent.hold('activation');
    const r = await run(e, runBody('slow'));
    expect(r.body.failure).toMatchObject({ failure_reason: 'Episode timed out', terminal: false });
    expect(r.body.failure.stage).toBeUndefined();
    expect(resources.count('close_session', 'slow')).toBe(1);
  });

  it('max_concurrent_episodes queues episodes and gives up after queue_timeout_seconds', async () => {
    const e = await env({ max_concurrent_episodes: 1, queue_timeout_seconds: 0.2 });
    agent.hold('activation');
    const first = run(e, runBody('q1'));
    await waitFor(() => agent.count('activation', 'q1') === 1);
    const second = await run(e, runBody('q2'));
    expect(second.body.failure).toEqual({ failure_reason: 'Episode admission timed out', terminal: false, stage: 'admission' });
    expect(resources.count('seed_session', 'q2')).toBe(0);
    agent.release('activation');
    expect((await first).body.result.reward).toBe(1);
    // Not kept: the attempt never began, so a retry runs it.
    expect((await run(e, runBody('q2'))).body.result.reward).toBe(1);
  });

  it('forwards /aggregate_metrics to the resources server', async () => {
    const e = await env();
    const r = await e.app.inject({ method: 'POST', url: '/aggregate_metrics', payload: { verify_responses: [] } });
    expect(r.statusCode).toBe(200);
    expect(r.json()).toMatchObject({ agent_metrics: { mean_reward: 0.5 }, echo: { verify_responses: [] } });
  });
});

describe('options', () => {
  it('fills defaults and names the key of a bad option', async () => {
    await fakes();
    const o = parseConfig(EnvironmentOptionsSchema, { agent: 'agent', resources: 'weather' }, 'servers.env.options');
    expect(o).toMatchObject({
      default_episode_timeout_seconds: null,
      cleanup_timeout_seconds: 30,
      max_concurrent_episodes: null,
      queue_timeout_seconds: null,
      checkpoint_boundaries: true,
    });
    expect(() => parseConfig(EnvironmentOptionsSchema, { agent: 'a', resources: 'r', max_concurrent_episodes: 2 }, 'servers.env.options')).toThrow(
      /servers\.env\.options\.queue_timeout_seconds/,
    );
    expect(() => parseConfig(EnvironmentOptionsSchema, { agent: 'a', resources: 'r', typo: 1 }, 'servers.env.options')).toThrow(/servers\.env\.options\.typo/);
    const ctx = envContext(agent, resources);
    await expect(environmentModule.build(ctx, { ...o, agent: 'nope' })).rejects.toThrow(ConfigError);
    await expect(environmentModule.build(ctx, { ...o, agent: 'weather' })).rejects.toThrow(/servers\.env\.options\.agent/);
  });
});

describe('checkpoints: boundaries exported while parked', () => {
  it('seed in flight: prepare is ready at once and the episode is exported at `seed`', async () => {
    await fakes({ verify: 'wait' });
    const e = await env();
    resources.hold('seed_session');
    const pending = track(run(e, runBody('s1')));
    await waitFor(() => resources.count('seed_session', 's1') === 1);
    const prep = await control(e, 'prepare', { checkpoint_id: 'c1', deadline_ts: soon() });
    expect(prep.body).toMatchObject({ phase: 'prepared', report: { ready: true, blockers: [], counts: { episodes: 1 } } });
    const { records, reply } = await commitAndRead(e, 'c1', [ep('s1')]);
    expect(reply.body.episode_ids).toEqual(['s1']);
    expect(records).toHaveLength(1);
    expect(records[0].boundary.next).toBe('seed');
    expect(records[0].boundary.handles.resources_session_id).toBe(resources.callsOf('seed_session')[0]!.body.resources_session_id);
    expect(records[0].task_digest).toMatch(/^[0-9a-f]{64}$/);
    // The seed completes during the checkpoint: the episode parks at `invoke_agent`, no activation yet.
    resources.release('seed_session');
    await waitFor(() => e.participant.steps.stateOf('s1') === 'parked');
    expect(e.participant.steps.boundaryOf('s1')?.next).toBe('invoke_agent');
    expect(agent.count('activation', 's1')).toBe(0);
    await control(e, 'resume', { checkpoint_id: 'c1', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.reward).toBe(1);
  });

  it('activation in flight: exported at `invoke_agent`; finishing during the checkpoint parks at `close_agent`', async () => {
    await fakes({ verify: 'wait' });
    const e = await env();
    agent.hold('activation');
    const pending = track(run(e, runBody('i1')));
    await waitFor(() => agent.count('activation', 'i1') === 1);
    const prep = await control(e, 'prepare', { checkpoint_id: 'c2', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    agent.release('activation');
    await waitFor(() => e.participant.steps.stateOf('i1') === 'parked');
    const { records } = await commitAndRead(e, 'c2');
    expect(records[0].boundary).toMatchObject({ next: 'close_agent', response: RESPONSE });
    expect(agent.count('agent_close', 'i1')).toBe(0);
    await control(e, 'resume', { checkpoint_id: 'c2', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.reward).toBe(1);
  });

  it('agent close in flight (a wait step): prepare waits for it, then the episode parks at `verify`', async () => {
    await fakes({ verify: 'wait' });
    const e = await env();
    agent.hold('agent_close');
    const pending = track(run(e, runBody('c1')));
    await waitFor(() => agent.count('agent_close', 'c1') === 1);
    const early = await control(e, 'prepare', { checkpoint_id: 'c3', deadline_ts: soon(0.3) });
    expect(early.body).toMatchObject({ phase: 'preparing', report: { ready: false, blockers: ['c1'], blocker_count: 1 } });
    agent.release('agent_close');
    const prep = await control(e, 'prepare', { checkpoint_id: 'c3', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    const { records } = await commitAndRead(e, 'c3');
    expect(records[0].boundary).toMatchObject({ next: 'verify', response: RESPONSE, observations: OBSERVATIONS });
    expect(resources.count('verify', 'c1')).toBe(0);
    await control(e, 'resume', { checkpoint_id: 'c3', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.ng_agent_observations).toEqual(OBSERVATIONS);
  });

  it('verify in wait mode: prepare waits for it, the episode parks at `return` and replies only after resume', async () => {
    await fakes({ verify: 'wait' });
    const e = await env();
    resources.hold('verify');
    const pending = track(run(e, runBody('verify-1')));
    await waitFor(() => resources.count('verify', 'verify-1') === 1);
    const early = await control(e, 'prepare', { checkpoint_id: 'c4', deadline_ts: soon(0.3) });
    expect(early.body.report.blockers).toEqual(['verify-1']);
    resources.release('verify');
    expect((await control(e, 'prepare', { checkpoint_id: 'c4', deadline_ts: soon() })).body.phase).toBe('prepared');
    const { records } = await commitAndRead(e, 'c4');
    expect(records[0].boundary).toMatchObject({ next: 'return', result: { reward: 1 }, observations: OBSERVATIONS });
    await sleep(50);
    expect(pending.settled()).toBe(false);
    expect(resources.count('close_session', 'verify-1')).toBe(0);
    await control(e, 'resume', { checkpoint_id: 'c4', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.reward).toBe(1);
    expect(resources.count('verify', 'verify-1')).toBe(1);
  });

  it('verify in replay mode: prepare is ready at once and the episode is exported at `verify`', async () => {
    await fakes({ verify: 'replay' });
    const e = await env();
    resources.hold('verify');
    const pending = track(run(e, runBody('verify-2')));
    await waitFor(() => resources.count('verify', 'verify-2') === 1);
    const prep = await control(e, 'prepare', { checkpoint_id: 'c5', deadline_ts: soon() });
    expect(prep.body).toMatchObject({ phase: 'prepared', report: { ready: true } });
    const { records } = await commitAndRead(e, 'c5');
    expect(records[0].boundary).toMatchObject({ next: 'verify', handles: { resources_verify: 'replay' } });
    resources.release('verify');
    await waitFor(() => e.participant.steps.stateOf('verify-2') === 'parked');
    expect(e.participant.steps.boundaryOf('verify-2')?.next).toBe('return');
    await control(e, 'resume', { checkpoint_id: 'c5', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.reward).toBe(1);
  });

  it('a replay step that fails during a checkpoint is exported with no boundary and cleans up after resume', async () => {
    await fakes({ verify: 'wait' });
    const e = await env();
    agent.hold('activation');
    agent.failWith.set('activation', { status: 500, body: 'boom' });
    const pending = track(run(e, runBody('fail-open')));
    await waitFor(() => agent.count('activation', 'fail-open') === 1);
    expect((await control(e, 'prepare', { checkpoint_id: 'c6', deadline_ts: soon() })).body.phase).toBe('prepared');
    agent.release('activation');
    await waitFor(() => e.participant.steps.boundaryOf('fail-open') === null);
    expect((await control(e, 'status')).body.report).toMatchObject({ ready: true, blockers: [] });
    const { records } = await commitAndRead(e, 'c6');
    expect(records).toEqual([expect.objectContaining({ episode_id: ep('fail-open'), boundary: null })]);
    await sleep(50);
    expect(agent.count('agent_close', 'fail-open')).toBe(0);
    expect(resources.count('close_session', 'fail-open')).toBe(0);
    expect(pending.settled()).toBe(false);
    await control(e, 'resume', { checkpoint_id: 'c6', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.failure).toMatchObject({ stage: 'agent', terminal: false, ng_agent_observations: OBSERVATIONS });
    expect(resources.count('close_session', 'fail-open')).toBe(1);
  });

  it('refuses a fresh /run while a checkpoint is open (admission_closed) and admits it after resume', async () => {
    await fakes();
    const e = await env();
    await control(e, 'prepare', { checkpoint_id: 'c7', deadline_ts: soon() });
    const r = await run(e, runBody('late'));
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('admission_closed');
    expect(resources.count('seed_session', 'late')).toBe(0);
    await control(e, 'resume', { checkpoint_id: 'c7', deadline_ts: soon() });
    expect((await run(e, runBody('late'))).body.result.reward).toBe(1);
  });
});

describe('checkpoints: restore into a fresh process', () => {
  /** Runs `key` until it parks at `stage` during checkpoint `id`, commits, and returns the directory. */
  async function checkpointAt(
    stage: 'invoke_agent' | 'close_agent' | 'verify' | 'return' | 'seed',
    key: string,
  ): Promise<{ dir: string; records: any[]; first: EnvironmentServer }> {
    const first = await env();
    const holdRoute = { seed: 'seed_session', invoke_agent: 'activation', close_agent: 'activation', verify: 'agent_close', return: 'verify' }[stage];
    const fake = holdRoute === 'seed_session' || holdRoute === 'verify' ? resources : agent;
    fake.hold(holdRoute);
    void run(first, runBody(key));
    await waitFor(() => fake.count(holdRoute, key) === 1);
    if (stage === 'seed' || stage === 'invoke_agent') {
      expect((await control(first, 'prepare', { checkpoint_id: 'ck', deadline_ts: soon() })).body.phase).toBe('prepared');
    } else if (stage === 'close_agent') {
      expect((await control(first, 'prepare', { checkpoint_id: 'ck', deadline_ts: soon() })).body.phase).toBe('prepared');
      fake.release(holdRoute);
      await waitFor(() => first.participant.steps.stateOf(key) === 'parked');
    } else {
      const prep = control(first, 'prepare', { checkpoint_id: 'ck', deadline_ts: soon() });
      await sleep(20);
      fake.release(holdRoute);
      expect((await prep).body.phase).toBe('prepared');
    }
    const { dir, records } = await commitAndRead(first, 'ck', [ep(key)]);
    expect(records.map((r) => r.boundary?.next ?? null)).toEqual([stage]);
    // The first process "crashes": it parks at its next boundary and is never resumed.
    fake.release(holdRoute);
    await waitFor(() => first.participant.steps.stateOf(key) === 'parked');
    agent.calls.length = 0;
    resources.calls.length = 0;
    return { dir, records, first };
  }

  async function restoreInto(dir: string, key: string): Promise<EnvironmentServer> {
    const fresh = await env();
    const restored = await control(fresh, 'restore', { checkpoint_id: 'restore-1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep(key)] });
    expect(restored.body).toMatchObject({ phase: 'restored', source_checkpoint_id: 'ck', restored: [`${key}-a1`] });
    expect((await control(fresh, 'status')).body.restored_pending).toEqual([`${key}-a1`]);
    return fresh;
  }

  beforeEach(() => fakes({ verify: 'wait' }));

  it('at `invoke_agent`: the replacement re-activates the same agent session without seeding again', async () => {
    const { dir, records } = await checkpointAt('invoke_agent', 'wx');
    const fresh = await restoreInto(dir, 'wx');
    // Admission stays closed until the resume that follows the restore, replacements included.
    const early = await run(fresh, runBody('wx', 1));
    expect(early.status).toBe(409);
    expect(early.body.error.code).toBe('admission_closed');
    expect((await control(fresh, 'status')).body.restored_pending).toEqual(['wx-a1']);
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    // The crashed attempt's stragglers are refused.
    expect((await run(fresh, runBody('wx', 0))).body.error.code).toBe('stale_attempt');

    const r = await run(fresh, runBody('wx', 1));
    expect(r.body.episode_id).toEqual(ep('wx', 1));
    expect(r.body.result.reward).toBe(1);
    const handles = records[0].boundary.handles;
    expect(resources.count('seed_session')).toBe(0);
    expect(agent.count('agent_seed')).toBe(0);
    const activation = agent.callsOf('activation')[0]!;
    expect(activation.key).toBe('wx-a1');
    expect(activation.headers['x-ng-agent-activation']).toBe('1');
    expect(activation.cookies).toEqual(handles.agent_cookies);
    expect(agent.callsOf('agent_close')[0]!.body).toEqual({ agent_session_id: handles.agent_session_id, episode_id: ep('wx', 1) });
    expect(resources.callsOf('verify')[0]!.cookies).toEqual(handles.resources_cookies);
    expect(resources.callsOf('close_session')[0]!.body.resources_session_id).toBe(handles.resources_session_id);
    expect((await control(fresh, 'status')).body.restored_pending).toEqual([]);
  });

  it('at `close_agent`: closes and verifies without invoking the agent again', async () => {
    const { dir } = await checkpointAt('close_agent', 'cl');
    const fresh = await restoreInto(dir, 'cl');
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    const r = await run(fresh, runBody('cl', 1));
    expect(r.body.result).toMatchObject({ reward: 1, response: RESPONSE, ng_agent_observations: OBSERVATIONS });
    expect(agent.count('agent_seed') + agent.count('activation') + resources.count('seed_session')).toBe(0);
    expect(agent.count('agent_close', 'cl-a1')).toBe(1);
    expect(resources.count('verify', 'cl-a1')).toBe(1);
  });

  it('at `verify`: verifies with the stored response and observations, never touching the agent', async () => {
    const { dir } = await checkpointAt('verify', 'vf');
    const fresh = await restoreInto(dir, 'vf');
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    const r = await run(fresh, runBody('vf', 1));
    expect(r.body.result).toMatchObject({ reward: 1, ng_agent_observations: OBSERVATIONS });
    expect(agent.calls).toHaveLength(0);
    expect(resources.callsOf('verify', 'vf-a1')[0]!.body.response).toEqual(RESPONSE);
    expect(resources.count('close_session', 'vf-a1')).toBe(1);
  });

  it('at `return`: replies with the stored result and only closes the resources session', async () => {
    const { dir, records } = await checkpointAt('return', 'rt');
    const fresh = await restoreInto(dir, 'rt');
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    const r = await run(fresh, runBody('rt', 1));
    expect(r.body.result).toEqual({ ...records[0].boundary.result, ng_agent_observations: OBSERVATIONS });
    expect(agent.calls).toHaveLength(0);
    expect(resources.calls.map((c) => c.route)).toEqual(['close_session']);
  });

  it('at `seed`: seeds again with the same session IDs', async () => {
    const { dir, records } = await checkpointAt('seed', 'sd');
    const fresh = await restoreInto(dir, 'sd');
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    const r = await run(fresh, runBody('sd', 1));
    expect(r.body.result.reward).toBe(1);
    expect(resources.callsOf('seed_session', 'sd-a1')[0]!.body.resources_session_id).toBe(records[0].boundary.handles.resources_session_id);
    expect(agent.callsOf('agent_seed', 'sd-a1')[0]!.body.tool_accesses[0].base_url).toBe(`${resources.url}/ng-rollout/sd-a1`);
  });

  it('a replacement whose task differs from the checkpointed one is refused (checkpoint_error); its record is kept', async () => {
    const { dir } = await checkpointAt('invoke_agent', 'dg');
    const fresh = await restoreInto(dir, 'dg');
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    const wrong = await run(fresh, runBody('dg', 1, task('NYC')));
    expect(wrong.status).toBe(409);
    expect(wrong.body.error.code).toBe('checkpoint_error');
    expect(agent.calls).toHaveLength(0);
    expect((await control(fresh, 'status')).body.restored_pending).toEqual(['dg-a1']);
    expect((await run(fresh, runBody('dg', 1))).body.result.reward).toBe(1);
    expect(resources.count('seed_session')).toBe(0);
  });

  it('an unclaimed restored record is exported again by the next checkpoint; a commit scope without it deletes it', async () => {
    const { dir, records } = await checkpointAt('verify', 'un');
    const fresh = await restoreInto(dir, 'un');
    await control(fresh, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    expect((await control(fresh, 'prepare', { checkpoint_id: 'again', deadline_ts: soon() })).body.phase).toBe('prepared');
    // A replacement that begins during a checkpoint is admitted and parks at its first boundary.
    const parked = track(run(fresh, runBody('un', 1)));
    await waitFor(() => fresh.participant.steps.stateOf('un-a1') === 'parked');
    expect(resources.calls).toHaveLength(0);
    const { records: again } = await commitAndRead(fresh, 'again', [ep('un', 1)]);
    expect(again).toEqual([{ episode_id: ep('un', 1), task_digest: records[0].task_digest, boundary: records[0].boundary }]);
    await control(fresh, 'resume', { checkpoint_id: 'again', deadline_ts: soon() });
    await waitFor(parked.settled);
    expect(parked.value()!.body.result.reward).toBe(1);

    // Unclaimed and outside the next commit's scope: deleted without a mark.
    const { dir: dir2 } = await checkpointAt('verify', 'gone');
    const fresh2 = await restoreInto(dir2, 'gone');
    await control(fresh2, 'resume', { checkpoint_id: 'restore-1', deadline_ts: soon() });
    await control(fresh2, 'prepare', { checkpoint_id: 'scoped', deadline_ts: soon() });
    const { records: none } = await commitAndRead(fresh2, 'scoped', []);
    expect(none).toEqual([]);
    expect((await control(fresh2, 'status')).body.restored_pending).toEqual([]);
    await control(fresh2, 'resume', { checkpoint_id: 'scoped', deadline_ts: soon() });
    // The attempt was not fenced: the controller may start it over as attempt 1 from its input.
    const over = await run(fresh2, runBody('gone', 1));
    expect(over.body.result.reward).toBe(1);
    expect(resources.count('seed_session', 'gone-a1')).toBe(1);
  });

  it('install is refused in a process with live episodes', async () => {
    const { dir } = await checkpointAt('invoke_agent', 'busy');
    const other = await env();
    agent.hold('activation');
    void run(other, runBody('live'));
    await waitFor(() => agent.count('activation', 'live') === 1);
    const r = await control(other, 'restore', { checkpoint_id: 'restore-2', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('busy')] });
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('checkpoint_error');
  });
});

describe('restarts', () => {
  it('a seed reply with x-ng-checkpoint-restart: 1 makes the episode a restart: never blocks, never parks, never exported', async () => {
    await fakes({ verify: 'wait', restart: true });
    const e = await env();
    agent.hold('agent_close'); // a wait step: would block a normal episode
    const pending = track(run(e, runBody('rs')));
    await waitFor(() => agent.count('agent_close', 'rs') === 1);
    const prep = await control(e, 'prepare', { checkpoint_id: 'r1', deadline_ts: soon() });
    expect(prep.body).toMatchObject({ phase: 'prepared', report: { ready: true, blockers: [], restarts: ['rs'] } });
    const inScope = await control(e, 'commit', { checkpoint_id: 'r1', deadline_ts: soon(), checkpoint_dir: checkpointDir(), episode_ids: [ep('rs')] });
    expect(inScope.body.error.code).toBe('restart_in_scope');
    const { records } = await commitAndRead(e, 'r1', []);
    expect(records).toEqual([]);
    // It keeps running through the checkpoint.
    agent.release('agent_close');
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.reward).toBe(1);
    expect((await control(e, 'status')).body.phase).toBe('committed');
    await control(e, 'resume', { checkpoint_id: 'r1', deadline_ts: soon() });
  });

  it('an agent seed reply with the restart header marks the episode a restart too', async () => {
    await fakes({ verify: 'wait', agentRestart: true });
    const e = await env();
    agent.hold('activation');
    void run(e, runBody('ar'));
    await waitFor(() => agent.count('activation', 'ar') === 1);
    expect(e.participant.steps.restarts()).toEqual(['ar']);
  });

  it('a restart mark waits while a checkpoint is open (the restart set never changes during one)', async () => {
    await fakes({ verify: 'wait', restart: true });
    const e = await env();
    resources.hold('seed_session');
    const pending = track(run(e, runBody('rw')));
    await waitFor(() => resources.count('seed_session', 'rw') === 1);
    expect((await control(e, 'prepare', { checkpoint_id: 'r2', deadline_ts: soon() })).body.report.restarts).toEqual([]);
    resources.release('seed_session');
    await sleep(50);
    expect(e.participant.steps.restarts()).toEqual([]);
    expect(agent.count('agent_seed', 'rw')).toBe(0);
    await control(e, 'resume', { checkpoint_id: 'r2', deadline_ts: soon() });
    await waitFor(pending.settled);
    expect(pending.value()!.body.result.reward).toBe(1);
  });

  it('with checkpoint_boundaries: false every episode is begun as a restart', async () => {
    await fakes({ verify: 'wait' });
    const e = await env({ checkpoint_boundaries: false });
    agent.hold('activation');
    const pending = track(run(e, runBody('nb')));
    await waitFor(() => agent.count('activation', 'nb') === 1);
    const prep = await control(e, 'prepare', { checkpoint_id: 'r3', deadline_ts: soon() });
    expect(prep.body.report).toMatchObject({ ready: true, restarts: ['nb'] });
    agent.release('activation');
    await waitFor(pending.settled);
    await control(e, 'resume', { checkpoint_id: 'r3', deadline_ts: soon() });
  });
});

describe('idempotent /run (our extension)', () => {
  beforeEach(() => fakes({ verify: 'wait' }));

  it('a duplicate /run of a running attempt joins it: one execution, the same reply', async () => {
    const e = await env();
    agent.hold('activation');
    const a = run(e, runBody('dup'));
    await waitFor(() => agent.count('activation', 'dup') === 1);
    const b = run(e, runBody('dup'));
    await sleep(30);
    agent.release('activation');
    const [ra, rb] = await Promise.all([a, b]);
    expect(rb).toEqual(ra);
    expect(ra.body.result.reward).toBe(1);
    expect(resources.count('seed_session', 'dup')).toBe(1);
    expect(agent.count('activation', 'dup')).toBe(1);
    expect(resources.count('verify', 'dup')).toBe(1);
  });

  it('a duplicate of a running attempt joins it even while a checkpoint is open', async () => {
    const e = await env();
    agent.hold('activation');
    const a = track(run(e, runBody('dup2')));
    await waitFor(() => agent.count('activation', 'dup2') === 1);
    await control(e, 'prepare', { checkpoint_id: 'd1', deadline_ts: soon() });
    const b = track(run(e, runBody('dup2')));
    agent.release('activation');
    await sleep(30);
    expect(b.settled()).toBe(false);
    await control(e, 'resume', { checkpoint_id: 'd1', deadline_ts: soon() });
    await waitFor(() => a.settled() && b.settled());
    expect(b.value()).toEqual(a.value());
    expect(agent.count('activation', 'dup2')).toBe(1);
  });

  it('a /run of a finished attempt returns the kept reply (handled failures too) until forget', async () => {
    const e = await env();
    const first = await run(e, runBody('done'));
    const again = await run(e, runBody('done'));
    expect(again).toEqual(first);
    expect(resources.count('seed_session', 'done')).toBe(1);
    // Another task under the same attempt is not the same run.
    const other = await run(e, runBody('done', 0, task('NYC')));
    expect(other.status).toBe(409);
    expect(other.body.error.code).toBe('checkpoint_error');

    resources.failWith.set('verify', { status: 500, body: 'x' });
    const failed = await run(e, runBody('failed'));
    resources.failWith.delete('verify');
    expect(await run(e, runBody('failed'))).toEqual(failed);
    expect(resources.count('verify', 'failed')).toBe(1);

    const forgot = await control(e, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['done', 'failed'] });
    expect(forgot.body).toEqual({ forgotten_count: 2 });
    await run(e, runBody('done'));
    expect(resources.count('seed_session', 'done')).toBe(2);
  });

  it('a refused /run is not kept: the retry after resume runs', async () => {
    const e = await env();
    await control(e, 'prepare', { checkpoint_id: 'd2', deadline_ts: soon() });
    expect((await run(e, runBody('refused'))).body.error.code).toBe('admission_closed');
    await control(e, 'resume', { checkpoint_id: 'd2', deadline_ts: soon() });
    expect((await run(e, runBody('refused'))).body.result.reward).toBe(1);
  });

  it('evicts the oldest kept reply beyond kept_replies_max and refuses its late duplicate', async () => {
    const e = await env({ kept_replies_max: 1 });
    await run(e, runBody('k1'));
    await run(e, runBody('k2'));
    const late = await run(e, runBody('k1'));
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('checkpoint_error');
    expect(resources.count('seed_session', 'k1')).toBe(1);
    expect((await run(e, runBody('k2'))).body.result.reward).toBe(1);
  });
});

describe('retire', () => {
  beforeEach(() => fakes({ verify: 'wait' }));

  it('stops a running attempt, cleans up its sessions, replies stale_attempt; late /runs are refused until forget', async () => {
    const e = await env();
    agent.hold('activation');
    const pending = track(run(e, runBody('rt')));
    await waitFor(() => agent.count('activation', 'rt') === 1);
    const retired = await control(e, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('rt')] });
    expect(retired.body).toEqual({ retired_count: 1 });
    // The retire returned only after the episode ended and its final cleanup ran.
    expect(pending.settled()).toBe(true);
    expect(pending.value()).toMatchObject({ status: 409, body: { error: { code: 'stale_attempt' } } });
    expect(agent.count('agent_close', 'rt')).toBe(1);
    expect(resources.count('close_session', 'rt')).toBe(1);
    expect(resources.count('verify', 'rt')).toBe(0);
    const status = await control(e, 'status');
    expect(status.body).toMatchObject({ retired_rollouts: 1, report: { counts: { episodes: 0 } } });

    agent.release('activation');
    const late = await run(e, runBody('rt'));
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('stale_attempt');
    expect(resources.count('seed_session', 'rt')).toBe(1);
    // A replacement attempt is a different capture key and runs normally.
    expect((await run(e, runBody('rt', 1))).body.result.reward).toBe(1);

    await control(e, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['rt'] });
    expect((await control(e, 'status')).body.retired_rollouts).toBe(0);
  });

  it('a retire of a finished attempt refuses its kept reply from then on', async () => {
    const e = await env();
    await run(e, runBody('fin'));
    await control(e, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('fin')] });
    expect((await run(e, runBody('fin'))).body.error.code).toBe('stale_attempt');
  });

  it('never interrupts final cleanup: a retire during it waits without cancelling', async () => {
    const e = await env();
    resources.hold('close_session');
    const pending = track(run(e, runBody('fc')));
    await waitFor(() => resources.count('close_session', 'fc') === 1);
    const retire = track(control(e, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('fc')] }));
    await sleep(50);
    expect(retire.settled()).toBe(false);
    expect((await control(e, 'status')).body.report).toMatchObject({ blockers: ['fc'] });
    resources.release('close_session');
    await waitFor(() => retire.settled() && pending.settled());
    expect(resources.count('close_session', 'fc')).toBe(1);
    expect(pending.value()!.body.result.reward).toBe(1);
  });

  it('a retire cut short by its deadline leaves the episode tracked and blocking; a retry waits again', async () => {
    const e = await env();
    resources.hold('close_session');
    void run(e, runBody('cut'));
    await waitFor(() => resources.count('close_session', 'cut') === 1);
    const short = await control(e, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(0.1), episode_ids: [ep('cut')] });
    expect(short.body.error.code).toBe('deadline_exceeded');
    expect(e.participant.steps.has('cut')).toBe(true);
    expect((await control(e, 'status')).body.report.blockers).toEqual(['cut']);
    const forget = await control(e, 'forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['cut'] });
    expect(forget.body.error.code).toBe('retire_incomplete');
    const again = track(control(e, 'retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('cut')] }));
    resources.release('close_session');
    await waitFor(again.settled);
    expect(again.value()!.body).toEqual({ retired_count: 1 });
    expect(e.participant.steps.has('cut')).toBe(false);
  });

  it('drops covered restored records', async () => {
    // Restore a record into a fresh process, then retire the replacement before it begins.
    agent.hold('activation');
    const first = await env();
    void run(first, runBody('rr'));
    await waitFor(() => agent.count('activation', 'rr') === 1);
    await control(first, 'prepare', { checkpoint_id: 'ck', deadline_ts: soon() });
    const { dir } = await commitAndRead(first, 'ck', [ep('rr')]);
    const fresh = await env();
    await control(fresh, 'restore', { checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('rr')] });
    const retired = await control(fresh, 'retire', { checkpoint_id: 'rs', deadline_ts: soon(), episode_ids: [ep('rr', 1)] });
    expect(retired.status).toBe(200);
    expect((await control(fresh, 'status')).body.restored_pending).toEqual([]);
  });
});
