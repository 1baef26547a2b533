// Test doubles of the environment server's peers: a tiny agent and a tiny resources server on
// 127.0.0.1 that log every call (capture key, body, cookies, headers) and can hold any route until
// the test releases it, so a test can open a checkpoint while a given stage is in flight.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { createGymApp, rolloutOf } from '../../servers/common/app.js';
import type { Deployment } from '../../servers/common/deployment.js';
import { closeDataAgent } from '../../servers/common/http-client.js';
import type { ServerContext } from '../../servers/common/server-context.js';
import { parseCookieHeader, setCookieValue } from '../../servers/common/session-cookie.js';
import { buildEnvironment, EnvironmentOptionsSchema, type EnvironmentServer } from '../../servers/environment/module.js';

export const TOKEN = 'env-test-token';
export const AUTH = { authorization: `Bearer ${TOKEN}` };

export interface FakeCall {
  route: string;
  key: string | undefined;
  body: any;
  cookies: Record<string, string>;
  headers: Record<string, string | string[] | undefined>;
}

interface Gate {
  promise: Promise<void>;
  release: () => void;
}

/** Holds and logs calls to one fake server. */
export class FakeServer {
  readonly calls: FakeCall[] = [];
  /** Per-route reply overrides: a status and body instead of the normal reply. */
  readonly failWith = new Map<string, { status: number; body: unknown }>();
  private readonly gates = new Map<string, Gate>();

  constructor(
    readonly app: FastifyInstance,
    public url = '',
  ) {}

  hold(route: string): void {
    let release!: () => void;
    const promise = new Promise<void>((r) => (release = r));
    this.gates.set(route, { promise, release });
  }

  release(route: string): void {
    this.gates.get(route)?.release();
    this.gates.delete(route);
  }

  releaseAll(): void {
    for (const route of [...this.gates.keys()]) this.release(route);
  }

  count(route: string, key?: string): number {
    return this.calls.filter((c) => c.route === route && (key === undefined || c.key === key)).length;
  }

  callsOf(route: string, key?: string): FakeCall[] {
    return this.calls.filter((c) => c.route === route && (key === undefined || c.key === key));
  }

  /** Logs the call, then waits while the route is held. */
  async enter(route: string, req: FastifyRequest): Promise<{ status: number; body: unknown } | undefined> {
    this.calls.push({
      route,
      key: rolloutOf(req)?.key,
      body: req.body,
      cookies: parseCookieHeader(req.headers.cookie),
      headers: { ...req.headers },
    });
    const gate = this.gates.get(route);
    if (gate) await gate.promise;
    return this.failWith.get(route);
  }
}

export interface FakeResourcesOptions {
  verify?: 'wait' | 'replay' | null;
  restart?: boolean;
}

export async function startFakeResources(opts: FakeResourcesOptions = {}): Promise<FakeServer> {
  const app = createGymApp({ name: 'fake_resources', kind: 'resources', logLevel: 'silent' });
  const fake = new FakeServer(app);
  app.post('/seed_session', async (req, reply) => {
    const fail = await fake.enter('seed_session', req);
    if (fail) return reply.code(fail.status).send(fail.body);
    const body = req.body as { resources_session_id: string };
    if (opts.verify !== null) reply.header('x-ng-checkpoint-verify', opts.verify ?? 'wait');
    if (opts.restart) reply.header('x-ng-checkpoint-restart', '1');
    reply.header('set-cookie', setCookieValue('session', `res-cookie-${body.resources_session_id}`));
    return { resources_session_id: body.resources_session_id, resources_tools: null, sandbox_access: null };
  });
  app.post('/verify', async (req, reply) => {
    const fail = await fake.enter('verify', req);
    if (fail) return reply.code(fail.status).send(fail.body);
    return { ...(req.body as object), reward: 1.0, verified_by: 'fake' };
  });
  app.post('/close_session', async (req, reply) => {
    const fail = await fake.enter('close_session', req);
    if (fail) return reply.code(fail.status).send(fail.body);
    return { resources_session_id: (req.body as { resources_session_id: string }).resources_session_id };
  });
  app.post('/aggregate_metrics', async (req) => {
    await fake.enter('aggregate_metrics', req);
    return { group_level_metrics: [], agent_metrics: { mean_reward: 0.5 }, echo: req.body };
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  fake.url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  return fake;
}

export const RESPONSE = {
  id: 'resp_1',
  object: 'response',
  output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'It is cold in SF.' }] }],
};
export const OBSERVATIONS = { source: 'fake_agent', records: [{ turn: 1 }], gaps: [] };

export async function startFakeAgent(opts: { restart?: boolean } = {}): Promise<FakeServer> {
  const app = createGymApp({ name: 'fake_agent', kind: 'agent', logLevel: 'silent' });
  const fake = new FakeServer(app);
  app.post('/v1/agent_sessions', async (req, reply) => {
    const fail = await fake.enter('agent_seed', req);
    if (fail) return reply.code(fail.status).send(fail.body);
    const body = req.body as { agent_session_id: string };
    if (opts.restart) reply.header('x-ng-checkpoint-restart', '1');
    reply.header('set-cookie', setCookieValue('session', `agent-cookie-${body.agent_session_id}`));
    return { agent_session_id: body.agent_session_id };
  });
  app.post('/v1/responses', async (req, reply) => {
    const fail = await fake.enter('activation', req);
    if (fail) return reply.code(fail.status).send(fail.body);
    return RESPONSE;
  });
  app.post('/v1/agent_sessions/close', async (req, reply) => {
    const fail = await fake.enter('agent_close', req);
    if (fail) return reply.code(fail.status).send(fail.body);
    const body = req.body as { agent_session_id: string };
    return { agent_session_id: body.agent_session_id, agent_observations: OBSERVATIONS, resources_cookies: null };
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  fake.url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  return fake;
}

export function envContext(agent: FakeServer, resources: FakeServer, checkpointEnabled = true): ServerContext {
  const checkpoint = { enabled: checkpointEnabled, control_auth_token: checkpointEnabled ? TOKEN : null, lease_grace_seconds: 600 };
  const deployment = {
    checkpoint,
    servers: {
      env: { kind: 'environment', port: 0, options: { agent: 'agent', resources: 'weather' } },
      agent: { kind: 'agent', port: 0, options: {} },
      weather: { kind: 'resources', port: 0, options: {} },
    },
  } as unknown as Deployment;
  return {
    name: 'env',
    entry: deployment.servers.env!,
    deployment,
    endpoints: {
      env: { kind: 'environment', url: 'http://127.0.0.1:1' },
      agent: { kind: 'agent', url: agent.url },
      weather: { kind: 'resources', url: resources.url },
    },
    checkpoint,
    sessionSecret: 'environment-test-session-secret',
    logLevel: 'silent',
  };
}

export async function startEnvironment(
  agent: FakeServer,
  resources: FakeServer,
  options: Record<string, unknown> = {},
  checkpointEnabled = true,
): Promise<EnvironmentServer> {
  const parsed = EnvironmentOptionsSchema.parse({ agent: 'agent', resources: 'weather', ...options });
  return buildEnvironment(envContext(agent, resources, checkpointEnabled), parsed);
}

export async function closeAll(apps: FastifyInstance[]): Promise<void> {
  // Client sockets first: a connection undici opened but never used is not "idle" to the server,
  // which would otherwise wait for the pool's keep-alive timeout.
  await closeDataAgent();
  await Promise.all(
    apps.map(async (a) => {
      const closing = a.close();
      a.server.closeAllConnections?.();
      await closing;
    }),
  );
}

export function task(city = 'SF', taskData: Record<string, unknown> = { city }) {
  return {
    task_id: { taskset: 'weather', task_id: `weather-${city}` },
    task_input: {
      responses_create_params: {
        input: [
          { role: 'developer', content: 'You are a helpful assistant.' },
          { role: 'user', content: `How is the weather in ${city}? [task weather city=${city}]` },
        ],
        tools: [{ type: 'function', name: 'get_weather', parameters: { type: 'object' } }],
      },
      task_data: taskData,
      agent_timeout_seconds: null,
    },
  };
}

export function runBody(rollout_id: string, attempt = 0, t = task()) {
  return { episode_id: { rollout_id, attempt }, task: t };
}
