// The agent server over real sockets on 127.0.0.1, with a fake policy model server and a fake
// tool (resources) server as test doubles of the other side. Checkpointing on.
import { readFile, readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGymApp, rolloutOf } from '../../servers/common/app.js';
import type { Deployment } from '../../servers/common/deployment.js';
import { callJson, closeDataAgent } from '../../servers/common/http-client.js';
import type { ServerContext } from '../../servers/common/server-context.js';
import simpleAgent, { AgentOptionsSchema } from '../../servers/agent/module.js';
import { sleep } from '../helpers/wait.js';
import { tempDir } from '../helpers/temp-dir.js';

const TOKEN = 'agent-test-token';
const SECRET = 'agent-test-session-secret-0123456789';

// --- fake policy model: tool call SF, tool call LA, then an answer --------------------------

interface ModelCall {
  key: string | null;
  body: { model: string; messages: Array<{ role: string; content?: unknown; tool_calls?: unknown[] }>; tools?: unknown[] };
}

interface Hold {
  arrived: Promise<void>;
  release(): void;
}

class FakeModel {
  app!: FastifyInstance;
  url = '';
  calls: ModelCall[] = [];
  private holds: Array<{ onArrive: () => void; released: Promise<void> }> = [];

  /** Holds the next call until released. */
  holdNext(): Hold {
    let onArrive!: () => void;
    let release!: () => void;
    const arrived = new Promise<void>((r) => (onArrive = r));
    const released = new Promise<void>((r) => (release = r));
    this.holds.push({ onArrive, released });
    return { arrived, release };
  }

  callsOf(key: string): ModelCall[] {
    return this.calls.filter((c) => c.key === key);
  }

  async start(): Promise<void> {
    this.app = createGymApp({ name: 'fake_model', kind: 'model', logLevel: 'silent' });
    this.app.post('/v1/chat/completions', async (req) => {
      const body = req.body as ModelCall['body'];
      this.calls.push({ key: rolloutOf(req)?.key ?? null, body });
      const hold = this.holds.shift();
      if (hold) {
        hold.onArrive();
        await hold.released;
      }
      const n = body.messages.filter((m) => m.role === 'assistant').length;
      const message =
        n < 2
          ? {
              role: 'assistant',
              content: null,
              tool_calls: [
                { id: `call_${n}`, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city: n === 0 ? 'SF' : 'LA' }) } },
              ],
            }
          : { role: 'assistant', content: 'It is cold in SF and LA.' };
      return {
        id: `chatcmpl-${n}`,
        object: 'chat.completion',
        created: 1,
        model: 'tiny-policy',
        choices: [{ index: 0, message, finish_reason: n < 2 ? 'tool_calls' : 'stop' }],
        usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
      };
    });
    await this.app.listen({ host: '127.0.0.1', port: 0 });
    this.url = `http://127.0.0.1:${(this.app.server.address() as { port: number }).port}`;
  }
}

// --- fake tool server (the resources side of a direct_http grant) ----------------------------

interface ToolCallSeen {
  key: string | null;
  tool: string;
  body: unknown;
  cookie: string | undefined;
}

class FakeTools {
  app!: FastifyInstance;
  url = '';
  calls: ToolCallSeen[] = [];
  private holds: Array<{ onArrive: () => void; released: Promise<void> }> = [];

  holdNext(): Hold {
    let onArrive!: () => void;
    let release!: () => void;
    const arrived = new Promise<void>((r) => (onArrive = r));
    const released = new Promise<void>((r) => (release = r));
    this.holds.push({ onArrive, released });
    return { arrived, release };
  }

  callsOf(key: string): ToolCallSeen[] {
    return this.calls.filter((c) => c.key === key);
  }

  async start(): Promise<void> {
    this.app = createGymApp({ name: 'fake_tools', kind: 'resources', logLevel: 'silent' });
    this.app.post('/:tool', async (req, reply) => {
      const tool = (req.params as { tool: string }).tool;
      this.calls.push({ key: rolloutOf(req)?.key ?? null, tool, body: req.body, cookie: req.headers.cookie });
      const hold = this.holds.shift();
      if (hold) {
        hold.onArrive();
        await hold.released;
      }
      if (tool !== 'get_weather') return reply.code(404).send({ error: { code: 'not_found', detail: `no tool ${tool}` } });
      reply.header('set-cookie', `session=res-${this.calls.length}; Path=/`);
      return { city: (req.body as { city: string }).city, weather_description: 'cold' };
    });
    await this.app.listen({ host: '127.0.0.1', port: 0 });
    this.url = `http://127.0.0.1:${(this.app.server.address() as { port: number }).port}`;
  }
}

// --- the agent under test --------------------------------------------------------------------

interface Agent {
  app: FastifyInstance;
  url: string;
  control(op: string, body: Record<string, unknown>): Promise<{ status: number; body: any }>;
  status(): Promise<any>;
}

const agents: FastifyInstance[] = [];

async function startAgent(modelUrl: string, options: Record<string, unknown> = {}, checkpointEnabled = true): Promise<Agent> {
  const ctx: ServerContext = {
    name: 'simple_agent',
    entry: { kind: 'agent', port: 0, options: {}, workers: 1 },
    deployment: {} as Deployment,
    endpoints: { policy_model: { kind: 'model', url: modelUrl } },
    checkpoint: { enabled: checkpointEnabled, control_auth_token: TOKEN, lease_grace_seconds: 600 },
    sessionSecret: SECRET,
    logLevel: 'silent',
  };
  const app = await simpleAgent.build(ctx, AgentOptionsSchema.parse({ model: 'policy_model', ...options }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  agents.push(app);
  const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const auth = { authorization: `Bearer ${TOKEN}` };
  return {
    app,
    url,
    async control(op, body) {
      const deadline_ts = Date.now() / 1000 + 30;
      const res = await app.inject({ method: 'POST', url: `/ng-control/v1/checkpoint/${op}`, headers: auth, payload: { deadline_ts, ...body } });
      return { status: res.statusCode, body: res.json() };
    },
    async status() {
      return (await app.inject({ method: 'GET', url: '/ng-control/v1/checkpoint/status', headers: auth })).json();
    },
  };
}

let model: FakeModel;
let tools: FakeTools;

beforeAll(async () => {
  model = new FakeModel();
  tools = new FakeTools();
  await Promise.all([model.start(), tools.start()]);
});

afterEach(async () => {
  await Promise.all(agents.splice(0).map((a) => a.close()));
});

afterAll(async () => {
  await Promise.all([model.app.close(), tools.app.close()]);
  await closeDataAgent();
});

const PARAMS = {
  input: [
    { role: 'developer', content: 'You are a helpful assistant.' },
    { role: 'user', content: 'How is the weather in SF and LA? [task weather city=SF]' },
  ],
  tools: [
    { type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
  ],
};

function sessionId(rollout: string): string {
  return `agent-session-${rollout.padEnd(32, '0')}`;
}

async function seed(agent: Agent, rollout: string, attempt = 0, key = rollout) {
  const res = await callJson<any>(
    agent.url,
    '/v1/agent_sessions',
    {
      agent_session_id: sessionId(rollout),
      episode_id: { rollout_id: rollout, attempt },
      task_id: { taskset: 'weather', task_id: rollout },
      tool_accesses: [
        {
          kind: 'direct_http',
          name: 'weather.direct_http',
          required: true,
          base_url: `${tools.url}/ng-rollout/${key}`,
          cookies: { session: 'res-0' },
          headers: {},
        },
      ],
      sandbox_access: null,
    },
    { rollout: key },
  );
  return res;
}

function activate(agent: Agent, key: string, cookies: Record<string, string>, index: string | undefined = '1') {
  return callJson<any>(agent.url, '/v1/responses', PARAMS, {
    rollout: key,
    cookies,
    headers: index === undefined ? {} : { 'x-ng-agent-activation': index },
  });
}

function assistantCounts(calls: ModelCall[]): number[] {
  return calls.map((c) => c.body.messages.filter((m) => m.role === 'assistant').length);
}

describe('agent server (simple_agent)', () => {
  it('runs a full activation (model → tool → model → tool → model) and returns a Responses-style object', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'full1');
    expect(s.status).toBe(200);
    expect(s.body).toEqual({ agent_session_id: sessionId('full1') });
    expect(s.cookies.session).toBeTruthy();

    const res = await activate(agent, 'full1', s.cookies);
    expect(res.status).toBe(200);
    const r = res.body;
    expect(r.object).toBe('response');
    expect(r.status).toBe('completed');
    expect(r.incomplete_details).toBeNull();
    expect(r._ng_trajectory).toBeUndefined(); // an indexed activation reports through close
    expect(r.output.map((i: any) => i.type)).toEqual(['function_call', 'function_call_output', 'function_call', 'function_call_output', 'message']);
    expect(r.output[0]).toMatchObject({ call_id: 'call_0', name: 'get_weather', arguments: '{"city":"SF"}' });
    expect(JSON.parse(r.output[1].output)).toEqual({ city: 'SF', weather_description: 'cold' });
    expect(r.output[4]).toEqual({ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'It is cold in SF and LA.' }] });
    expect(r.usage).toEqual({ input_tokens: 30, output_tokens: 15, total_tokens: 45 });

    // Chat completions under the activation's prefix, one assistant message per earlier model call.
    const calls = model.callsOf('full1');
    expect(assistantCounts(calls)).toEqual([0, 1, 2]);
    expect(calls[0]!.body.model).toBe('policy');
    expect(calls[0]!.body.messages[0]).toEqual({ role: 'system', content: 'You are a helpful assistant.' });
    expect(calls[0]!.body.tools).toEqual([
      { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: PARAMS.tools[0]!.parameters } },
    ]);
    expect(calls[2]!.body.messages.slice(2)).toEqual([
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'get_weather', arguments: '{"city":"SF"}' } }] },
      { role: 'tool', tool_call_id: 'call_0', content: r.output[1].output },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"LA"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: r.output[3].output },
    ]);
    // Tools on the grant's base URL (one prefix), with the grant's cookie, then the one it set.
    const tc = tools.callsOf('full1');
    expect(tc.map((c) => [c.tool, c.body])).toEqual([
      ['get_weather', { city: 'SF' }],
      ['get_weather', { city: 'LA' }],
    ]);
    expect(tc[0]!.cookie).toBe('session=res-0');
    expect(tc[1]!.cookie).toMatch(/^session=res-\d+$/);

    const close = await callJson<any>(
      agent.url,
      '/v1/agent_sessions/close',
      { agent_session_id: sessionId('full1'), episode_id: { rollout_id: 'full1', attempt: 0 } },
      { rollout: 'full1' },
    );
    expect(close.status).toBe(200);
    expect(close.body.agent_observations.source).toBe('simple_agent');
    expect(close.body.agent_observations.records).toHaveLength(1);
    expect(close.body.agent_observations.records[0]).toMatchObject({ invocation_id: 'root', activation: 1 });
    expect(close.body.resources_cookies).toEqual({ session: expect.stringMatching(/^res-\d+$/) });
    // A retried close gets the same receipt; a late seed of the closed ID is fenced.
    const again = await callJson<any>(
      agent.url,
      '/v1/agent_sessions/close',
      { agent_session_id: sessionId('full1'), episode_id: { rollout_id: 'full1', attempt: 0 } },
      { rollout: 'full1' },
    );
    expect(again.body).toEqual(close.body);
    expect((await seed(agent, 'full1')).status).toBe(409);
  });

  it('replays an activation idempotently and refuses out-of-order or unprefixed ones', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'idem1');
    // A repeated identical seed returns the same session.
    expect((await seed(agent, 'idem1')).body).toEqual({ agent_session_id: sessionId('idem1') });
    const first = await activate(agent, 'idem1', s.cookies, '1');
    expect(first.status).toBe(200);
    const before = model.calls.length;
    const toolsBefore = tools.calls.length;

    const replay = await activate(agent, 'idem1', s.cookies, '1');
    expect(replay.status).toBe(200);
    expect(replay.body).toEqual(first.body);
    expect(model.calls.length).toBe(before);
    expect(tools.calls.length).toBe(toolsBefore);

    for (const bad of ['3', '0', 'x', '-1']) {
      const r = await activate(agent, 'idem1', s.cookies, bad);
      expect(r.status, bad).toBe(409);
      expect(r.body.error.code).toBe('activation_out_of_order');
    }
    const unprefixed = await callJson<any>(agent.url, '/v1/responses', PARAMS, { cookies: s.cookies, headers: { 'x-ng-agent-activation': '1' } });
    expect(unprefixed.status).toBe(400);
    expect(unprefixed.body.error.code).toBe('rollout_id_required');
    const otherAttempt = await activate(agent, 'idem1-a1', s.cookies, '1');
    expect(otherAttempt.status).toBe(409);
    expect(otherAttempt.body.error.code).toBe('stale_attempt');

    // The next activation runs and is reported as `activation-2`.
    const second = await activate(agent, 'idem1', s.cookies, '2');
    expect(second.status).toBe(200);
    expect(model.calls.length).toBe(before + 3);
    const close = await callJson<any>(agent.url, '/v1/agent_sessions/close', {
      agent_session_id: sessionId('idem1'),
      episode_id: { rollout_id: 'idem1', attempt: 0 },
    });
    expect(close.body.agent_observations.records.map((r: any) => r.invocation_id)).toEqual(['root', 'activation-2']);
  });

  it('a duplicate of a running activation waits for it and gets its reply', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'dup1');
    const hold = model.holdNext();
    const a = activate(agent, 'dup1', s.cookies, '1');
    await hold.arrived;
    const b = activate(agent, 'dup1', s.cookies, '1');
    await sleep(50);
    hold.release();
    const [ra, rb] = await Promise.all([a, b]);
    expect(ra.status).toBe(200);
    expect(rb.body).toEqual(ra.body);
    expect(model.callsOf('dup1')).toHaveLength(3);
  });

  it('prepare while the model call is in flight: ready at once, the reply is held until resume, no extra model call', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'held1');
    const hold = model.holdNext();
    let finished = false;
    const act = activate(agent, 'held1', s.cookies).then((r) => {
      finished = true;
      return r;
    });
    await hold.arrived;
    const prep = await agent.control('prepare', { checkpoint_id: 'ck-held' });
    expect(prep.status).toBe(200);
    expect(prep.body.phase).toBe('prepared');
    expect(prep.body.report).toMatchObject({ ready: true, blocker_count: 0, counts: { sessions: 1, at_boundary: 1 } });

    hold.release();
    await sleep(150);
    expect(finished).toBe(false);
    const st = await agent.status();
    expect(st.report.ready).toBe(true); // never regresses between prepare and commit
    expect(st.accepting).toBe(false);
    expect(model.callsOf('held1')).toHaveLength(1);

    expect((await agent.control('resume', { checkpoint_id: 'ck-held' })).body).toEqual({ phase: 'idle', idempotent: false });
    const res = await act;
    expect(res.status).toBe(200);
    expect(res.body.output).toHaveLength(5);
    expect(assistantCounts(model.callsOf('held1'))).toEqual([0, 1, 2]);
  });

  it('prepare waits for a tool round, then the session parks at the next boundary', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'tool1');
    const hold = tools.holdNext();
    const act = activate(agent, 'tool1', s.cookies);
    await hold.arrived;
    const prepared = agent.control('prepare', { checkpoint_id: 'ck-tool' });
    await sleep(100);
    const st = await agent.status();
    expect(st.phase).toBe('preparing');
    expect(st.report).toMatchObject({ ready: false, blockers: ['tool1'] });
    hold.release();
    const prep = await prepared;
    expect(prep.body.phase).toBe('prepared');
    expect(model.callsOf('tool1')).toHaveLength(1); // parked after the tool round, before call 2
    await agent.control('resume', { checkpoint_id: 'ck-tool' });
    expect((await act).status).toBe(200);
    expect(model.callsOf('tool1')).toHaveLength(3);
  });

  it('exports a parked session; a fresh agent installs it and the replacement continues from the boundary', async () => {
    const dir = tempDir('agent-ckpt');
    try {
      const agent = await startAgent(model.url);
      const s = await seed(agent, 'exp1');
      // Hold model call 2: its reply arrives after prepare and is held.
      model.holdNext().release(); // call 1 passes
      const hold = model.holdNext();
      const act = activate(agent, 'exp1', s.cookies);
      act.catch(() => undefined);
      await hold.arrived;
      expect((await agent.control('prepare', { checkpoint_id: 'ck-exp' })).body.phase).toBe('prepared');
      hold.release();
      await sleep(100);
      const commit = await agent.control('commit', { checkpoint_id: 'ck-exp', checkpoint_dir: dir, episode_ids: [{ rollout_id: 'exp1', attempt: 0 }] });
      expect(commit.status).toBe(200);
      expect(commit.body.episode_ids).toEqual(['exp1']);
      expect(commit.body.manifest.record_count).toBe(1);

      const recDir = path.join(dir, 'gym', 'agent', 'simple_agent');
      const file = (await readdir(recDir)).find((f) => f.startsWith('records-'))!;
      const record = JSON.parse((await readFile(path.join(recDir, file), 'utf8')).trim());
      expect(Object.keys(record)).toEqual(['episode_id', 'session_key', 'session', 'boundary', 'episode']);
      expect(record.episode).toBeNull();
      expect(record.session_key).toBe(sessionId('exp1'));
      expect(record.session).toMatchObject({ activations: 1, completed_activation: 0, completed_reply: null, resources_cookies: { session: 'res-0' } });
      // The boundary before model call 2 (after the first tool round).
      expect(record.boundary).toMatchObject({ step: 1, pending_tools: false });
      expect(record.boundary.new_outputs.map((i: any) => i.type)).toEqual(['function_call', 'function_call_output']);
      expect(Object.keys(record.boundary).sort()).toEqual(
        [
          'gaps',
          'last_model_response',
          'model_calls',
          'model_server_cookies',
          'new_outputs',
          'pending_tools',
          'resources_server_cookies',
          'step',
          'tool_records',
          'turns',
          'usage',
        ].sort(),
      );

      // Crash: the old process goes away without resuming.
      await agent.app.close();
      const modelBefore = model.callsOf('exp1').length;
      const toolsBefore = tools.callsOf('exp1').length;
      expect(modelBefore).toBe(2);
      expect(toolsBefore).toBe(1);

      const fresh = await startAgent(model.url);
      const restore = await fresh.control('restore', { checkpoint_id: 'rs-exp', checkpoint_dir: dir, episode_ids: [{ rollout_id: 'exp1', attempt: 0 }] });
      expect(restore.body).toEqual({ phase: 'restored', source_checkpoint_id: 'ck-exp', restored: ['exp1-a1'] });
      expect((await fresh.status()).restored_pending).toEqual(['exp1-a1']);
      await fresh.control('resume', { checkpoint_id: 'rs-exp' });

      // A checkpoint before the replacement claims it re-exports the restored boundary.
      const dir2 = path.join(dir, 'second');
      expect((await fresh.control('prepare', { checkpoint_id: 'ck-exp2' })).body.phase).toBe('prepared');
      const commit2 = await fresh.control('commit', { checkpoint_id: 'ck-exp2', checkpoint_dir: dir2, episode_ids: [{ rollout_id: 'exp1', attempt: 1 }] });
      expect(commit2.body.episode_ids).toEqual(['exp1-a1']);
      const recDir2 = path.join(dir2, 'gym', 'agent', 'simple_agent');
      const file2 = (await readdir(recDir2)).find((f) => f.startsWith('records-'))!;
      const record2 = JSON.parse((await readFile(path.join(recDir2, file2), 'utf8')).trim());
      expect(record2.episode_id).toEqual({ rollout_id: 'exp1', attempt: 1 });
      expect(record2.boundary).toEqual(record.boundary);
      expect(record2.session.request.episode_id).toEqual({ rollout_id: 'exp1', attempt: 1 });
      await fresh.control('resume', { checkpoint_id: 'ck-exp2' });

      // The crashed attempt's stragglers are refused; the replacement continues with the old cookie.
      const stale = await activate(fresh, 'exp1', s.cookies);
      expect(stale.status).toBe(409);
      expect(stale.body.error.code).toBe('stale_attempt');
      const res = await activate(fresh, 'exp1-a1', s.cookies, '1');
      expect(res.status).toBe(200);
      expect(res.body.output.map((i: any) => i.type)).toEqual(['function_call', 'function_call_output', 'function_call', 'function_call_output', 'message']);

      // Only the calls not yet made (the held call is re-issued), under the replacement's prefix.
      expect(assistantCounts(model.callsOf('exp1-a1'))).toEqual([1, 2]);
      expect(model.callsOf('exp1')).toHaveLength(modelBefore);
      expect(tools.callsOf('exp1-a1').map((c) => c.body)).toEqual([{ city: 'LA' }]);
      expect(tools.callsOf('exp1')).toHaveLength(toolsBefore);
      expect((await fresh.status()).restored_pending).toEqual([]);

      const close = await callJson<any>(
        fresh.url,
        '/v1/agent_sessions/close',
        { agent_session_id: sessionId('exp1'), episode_id: { rollout_id: 'exp1', attempt: 1 } },
        { rollout: 'exp1-a1' },
      );
      expect(close.status).toBe(200);
      const rec = close.body.agent_observations;
      expect(rec.records[0]).toMatchObject({ invocation_id: 'root', activation: 1 });
      expect(rec.gaps).toEqual([{ kind: 'restored', invocation_id: 'root', step: 1, attempt: 1 }]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('an agent that outlived the crash takes the restored session back although the dead attempt closed it (chaos seed 701)', async () => {
    const dir = tempDir('agent-survivor');
    try {
      const agent = await startAgent(model.url);
      const s = await seed(agent, 'surv1');
      model.holdNext().release();
      const hold = model.holdNext();
      const act = activate(agent, 'surv1', s.cookies);
      act.catch(() => undefined);
      await hold.arrived;
      await agent.control('prepare', { checkpoint_id: 'ck-surv' });
      hold.release();
      await sleep(100);
      const commit = await agent.control('commit', { checkpoint_id: 'ck-surv', checkpoint_dir: dir, episode_ids: [{ rollout_id: 'surv1', attempt: 0 }] });
      expect(commit.body.episode_ids).toEqual(['surv1']);
      await agent.control('resume', { checkpoint_id: 'ck-surv' });
      await act;
      // Attempt 0 fails another way (its model died) and its harness closes the session here.
      const dead = await callJson<any>(
        agent.url,
        '/v1/agent_sessions/close',
        { agent_session_id: sessionId('surv1'), episode_id: { rollout_id: 'surv1', attempt: 0 } },
        { rollout: 'surv1' },
      );
      expect(dead.status).toBe(200);
      // Recovery restores the saved turn into this same process as attempt 1.
      const restore = await agent.control('restore', { checkpoint_id: 'rs-surv', checkpoint_dir: dir, episode_ids: [{ rollout_id: 'surv1', attempt: 0 }] });
      expect(restore.body.restored).toEqual(['surv1-a1']);
      await agent.control('resume', { checkpoint_id: 'rs-surv' });
      expect((await activate(agent, 'surv1-a1', s.cookies, '1')).status).toBe(200);
      const close = await callJson<any>(
        agent.url,
        '/v1/agent_sessions/close',
        { agent_session_id: sessionId('surv1'), episode_id: { rollout_id: 'surv1', attempt: 1 } },
        { rollout: 'surv1-a1' },
      );
      expect(close.status).toBe(200);
      // The dead attempt's retried close is still refused: the session is the replacement's.
      const late = await callJson<any>(
        agent.url,
        '/v1/agent_sessions/close',
        { agent_session_id: sessionId('surv1'), episode_id: { rollout_id: 'surv1', attempt: 0 } },
        { rollout: 'surv1' },
      );
      expect(late.body.error?.code).toBe('stale_attempt');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('retire stops a running activation and refuses the attempt afterwards', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'ret1');
    const hold = model.holdNext();
    const act = activate(agent, 'ret1', s.cookies);
    await hold.arrived;
    const retire = await agent.control('retire', { checkpoint_id: 'retire', episode_ids: [{ rollout_id: 'ret1', attempt: 0 }] });
    expect(retire.body).toEqual({ retired_count: 1 });
    const res = await act;
    expect(res.status).toBe(409);
    expect(res.body.error.code).toBe('stale_attempt');
    hold.release();
    const st = await agent.status();
    expect(st.report.counts.sessions).toBe(0);
    expect(st.retired_rollouts).toBe(1);

    const late = await activate(agent, 'ret1', s.cookies, '1');
    expect(late.body.error.code).toBe('stale_attempt');
    expect((await seed(agent, 'ret1')).body.error.code).toBe('stale_attempt');
    const close = await callJson<any>(agent.url, '/v1/agent_sessions/close', {
      agent_session_id: sessionId('ret1'),
      episode_id: { rollout_id: 'ret1', attempt: 0 },
    });
    expect(close.body.error.code).toBe('stale_attempt');
    expect(model.callsOf('ret1')).toHaveLength(1);
  });

  it('a close cancels a still-running activation and waits for it', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'cls1');
    const hold = model.holdNext();
    const act = activate(agent, 'cls1', s.cookies);
    await hold.arrived;
    const close = await callJson<any>(
      agent.url,
      '/v1/agent_sessions/close',
      { agent_session_id: sessionId('cls1'), episode_id: { rollout_id: 'cls1', attempt: 0 } },
      { rollout: 'cls1' },
    );
    expect(close.status).toBe(200);
    expect(close.body.agent_observations.gaps[0]).toMatchObject({ kind: 'cancelled', invocation_id: 'root' });
    expect(close.body.resources_cookies).toEqual({ session: 'res-0' });
    expect((await act).status).toBe(409);
    hold.release();
  });

  it('a seed while a checkpoint is open waits for resume', async () => {
    const agent = await startAgent(model.url);
    await agent.control('prepare', { checkpoint_id: 'ck-seed' });
    let done = false;
    const s = seed(agent, 'seedw1').then((r) => {
      done = true;
      return r;
    });
    await sleep(100);
    expect(done).toBe(false);
    await agent.control('resume', { checkpoint_id: 'ck-seed' });
    expect((await s).status).toBe(200);
  });

  it('an activation that starts while a checkpoint is open parks at its first boundary', async () => {
    const agent = await startAgent(model.url);
    const s = await seed(agent, 'first1');
    await agent.control('prepare', { checkpoint_id: 'ck-first' });
    const act = activate(agent, 'first1', s.cookies);
    await sleep(100);
    const st = await agent.status();
    expect(st.report).toMatchObject({ ready: true, counts: { sessions: 1, at_boundary: 1 } });
    expect(model.callsOf('first1')).toHaveLength(0);
    await agent.control('resume', { checkpoint_id: 'ck-first' });
    expect((await act).status).toBe(200);
    expect(model.callsOf('first1')).toHaveLength(3);
  });

  it('refuses a restore into an agent with live sessions', async () => {
    const agent = await startAgent(model.url);
    await seed(agent, 'live1');
    const r = await agent.control('restore', { checkpoint_id: 'rs-live', checkpoint_dir: '/nonexistent-agent-ckpt', episode_ids: [] });
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('checkpoint_error');
  });

  it('a direct call without a session cookie is a restart; without a prefix it is refused', async () => {
    const agent = await startAgent(model.url);
    const noPrefix = await callJson<any>(agent.url, '/v1/responses', PARAMS);
    expect(noPrefix.status).toBe(400);
    expect(noPrefix.body.error.code).toBe('rollout_id_required');
    const hold = model.holdNext();
    const act = callJson<any>(agent.url, '/v1/responses', PARAMS, { rollout: 'direct1' });
    await hold.arrived;
    expect((await agent.status()).report).toMatchObject({ ready: true, restarts: ['direct1'] });
    hold.release();
    const res = await act;
    expect(res.status).toBe(200);
    // No tool access without a grant: the error is fed back to the model, which answers.
    expect(res.body.output[1].output).toBe("Error: no tool access for tool 'get_weather'");
    expect(res.body._ng_trajectory.invocation_id).toBe('root');
  });

  it('with checkpointing off needs no prefix and no activation index', async () => {
    const agent = await startAgent(model.url, {}, false);
    const s = await callJson<any>(agent.url, '/v1/agent_sessions', { agent_session_id: 'agent-session-off', tool_accesses: [] });
    expect(s.status).toBe(200);
    const r = await callJson<any>(agent.url, '/v1/responses', PARAMS, { cookies: s.cookies });
    expect(r.status).toBe(200);
    expect(r.body._ng_trajectory).toBeDefined();
    expect((await agent.app.inject({ method: 'GET', url: '/ng-control/v1/checkpoint/status' })).statusCode).toBe(404);
  });

  it('tool HTTP errors are fed back to the model as output', async () => {
    const { callTool } = await import('../../servers/agent/peers.js');
    const grant = { kind: 'direct_http' as const, name: 'g', required: true, base_url: `${tools.url}/ng-rollout/tool-err`, cookies: {}, headers: {} };
    const out = await callTool({
      grant,
      rollout: 'tool-err',
      call: { type: 'function_call', call_id: 'c', name: 'nope', arguments: '{}' },
      cookies: {},
      signal: new AbortController().signal,
    });
    expect(out.output).toMatch(/^Error: tool 'nope' failed with HTTP 404/);
    expect(out.record).toMatchObject({ status: 404 });
  });

  it('restart-only mode lists in-flight calls as restarts and never blocks', async () => {
    const agent = await startAgent(model.url, { checkpoint_sessions_supported: false });
    const s = await seed(agent, 'ro1');
    expect(s.headers['x-ng-checkpoint-restart']).toBe('1');
    const hold = model.holdNext();
    const act = activate(agent, 'ro1', s.cookies);
    await hold.arrived;
    const st = await agent.status();
    expect(st.report).toMatchObject({ ready: true, blockers: [], counts: { inflight: 1 }, restarts: ['ro1'] });

    const prep = await agent.control('prepare', { checkpoint_id: 'ck-ro' });
    expect(prep.body.phase).toBe('prepared');
    expect(prep.body.report.restarts).toEqual(['ro1']);
    const dir = tempDir('agent-ro');
    try {
      // A restart in scope is refused (this agent holds none of its state).
      const inScope = await agent.control('commit', { checkpoint_id: 'ck-ro', checkpoint_dir: dir, episode_ids: [{ rollout_id: 'ro1', attempt: 0 }] });
      expect(inScope.body.error.code).toBe('restart_in_scope');
      // The activation keeps running through the open checkpoint.
      hold.release();
      const res = await act;
      expect(res.status).toBe(200);
      expect((await agent.status()).phase).toBe('prepared');
      const commit = await agent.control('commit', { checkpoint_id: 'ck-ro', checkpoint_dir: dir, episode_ids: [] });
      expect(commit.body.manifest.record_count).toBe(0);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    await agent.control('resume', { checkpoint_id: 'ck-ro' });
    expect((await agent.status()).report.restarts).toEqual([]);

    // Retire frees (closes) the session; the attempt is refused afterwards.
    await agent.control('retire', { checkpoint_id: 'retire', episode_ids: [{ rollout_id: 'ro1', attempt: 0 }] });
    expect((await activate(agent, 'ro1', s.cookies, '2')).body.error.code).toBe('stale_attempt');
  });
});
