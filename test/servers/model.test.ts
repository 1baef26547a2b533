import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGymApp } from '../../servers/common/app.js';
import { ConfigError, parseConfig } from '../../servers/common/config-error.js';
import { parseDeployment } from '../../servers/common/deployment.js';
import { closeDataAgent } from '../../servers/common/http-client.js';
import type { ServerContext } from '../../servers/common/server-context.js';
import type { GenerationCall, GenerationGate } from '../../servers/model/gate.js';
import policyModel, { PolicyModelOptionsSchema } from '../../servers/model/module.js';
import { backendRootOf, registerModelProxy } from '../../servers/model/proxy.js';
import { resolveBackend } from '../../servers/model/backend.js';
import { sleep } from '../helpers/wait.js';

// --- a fake inference backend: records every call; streams SSE chunks the test releases one by one

interface Seen {
  method: string;
  url: string;
  body: string;
}

let backend: Server;
let backendUrl: string;
const seen: Seen[] = [];
// Chunks the streaming backend sends, one at a time, as the test pushes them (null ends the stream).
let streamQueue: Array<string | null> = [];
let streamWaiters: Array<(c: string | null) => void> = [];

function resetStream(): void {
  streamQueue = [];
  streamWaiters = [];
}

function pushStream(c: string | null): void {
  const w = streamWaiters.shift();
  if (w) w(c);
  else streamQueue.push(c);
}

function takeStream(): Promise<string | null> {
  return streamQueue.length ? Promise.resolve(streamQueue.shift()!) : new Promise((r) => streamWaiters.push(r));
}

async function onBackend(req: IncomingMessage, res: ServerResponse): Promise<void> {
  let body = '';
  for await (const c of req) body += c;
  seen.push({ method: req.method ?? '', url: req.url ?? '', body });
  const path = (req.url ?? '').replace(/^\/ng-rollout\/[^/]+/, '');
  if (req.method === 'GET' && path.startsWith('/v1/models')) {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [{ id: 'fake-model', object: 'model' }] }));
    return;
  }
  const parsed = JSON.parse(body) as { stream?: boolean; fail?: boolean };
  if (parsed.fail) {
    res.writeHead(409, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'stale_attempt', detail: 'x' } }));
    return;
  }
  if (!parsed.stream) {
    res.writeHead(200, { 'content-type': 'application/json', 'x-backend': 'fake' });
    res.end(JSON.stringify({ id: 'c1', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' } }], path: req.url }));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  res.flushHeaders();
  for (;;) {
    const chunk = await takeStream();
    if (chunk === null) break;
    res.write(chunk);
  }
  res.end();
}

beforeAll(async () => {
  backend = createServer((req, res) => void onBackend(req, res));
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  backendUrl = `http://127.0.0.1:${(backend.address() as AddressInfo).port}`;
});
afterAll(async () => {
  backend.closeAllConnections();
  await new Promise((r) => backend.close(r));
  await closeDataAgent();
});

const apps: FastifyInstance[] = [];
afterEach(async () => {
  seen.length = 0;
  await Promise.all(apps.splice(0).map((a) => a.close()));
});

function contextFor(options: Record<string, unknown>, endpoints = { policy_backend: { kind: 'inference' as const, url: backendUrl } }): ServerContext {
  const deployment = parseDeployment({
    servers: { policy_backend: { kind: 'inference' }, policy_model: { kind: 'model', options } },
  });
  return {
    name: 'policy_model',
    entry: deployment.servers.policy_model!,
    deployment,
    endpoints: { ...endpoints, policy_model: { kind: 'model', url: 'http://127.0.0.1:1' } },
    checkpoint: deployment.checkpoint,
    sessionSecret: 'test-session-secret-0123456789',
    logLevel: 'silent',
  };
}

async function startModel(options: Record<string, unknown> = { backend: 'policy_backend' }): Promise<string> {
  const opts = parseConfig(PolicyModelOptionsSchema, options, 'servers.policy_model.options');
  const app = await policyModel.build(contextFor(options), opts);
  apps.push(app);
  await app.listen({ host: '127.0.0.1', port: 0 });
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
}

/** The fake backend as ours (`backend_api: ng`). */
const ours = () => resolveBackend({ api: 'ng', url: backendUrl, configKey: 'test' });

const chat = { model: 'fake-model', messages: [{ role: 'user', content: '[task weather city=SF]' }] };

async function post(url: string, body: unknown): Promise<{ status: number; json: any; headers: Record<string, unknown> }> {
  const res = await request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await res.body.text();
  return { status: res.statusCode, json: text ? JSON.parse(text) : undefined, headers: res.headers };
}

describe('policy model proxy', { timeout: 10_000 }, () => {
  it('forwards a plain call under the same /ng-rollout prefix and relays the reply', async () => {
    const model = await startModel();
    const r = await post(`${model}/ng-rollout/wx-17-a2/v1/chat/completions`, chat);
    expect(r.status).toBe(200);
    expect(r.json.choices[0].message.content).toBe('hi');
    expect(r.headers['x-backend']).toBe('fake');
    expect(seen).toHaveLength(1);
    expect(seen[0]!.url).toBe('/ng-rollout/wx-17-a2/v1/chat/completions');
    expect(JSON.parse(seen[0]!.body)).toEqual(chat);
  });

  it('forwards a call without a prefix as is (no episode)', async () => {
    const model = await startModel();
    const r = await post(`${model}/v1/chat/completions`, chat);
    expect(r.status).toBe(200);
    expect(seen[0]!.url).toBe('/v1/chat/completions');
  });

  it('uses backend_url, with or without a trailing /v1', async () => {
    expect(backendRootOf('http://h:1/v1/')).toBe('http://h:1');
    expect(backendRootOf('http://h:1')).toBe('http://h:1');
    const model = await startModel({ backend_url: `${backendUrl}/v1` });
    const r = await post(`${model}/ng-rollout/r1/v1/chat/completions`, chat);
    expect(r.status).toBe(200);
    expect(seen[0]!.url).toBe('/ng-rollout/r1/v1/chat/completions');
  });

  it('streams SSE chunks through as they arrive (no buffering)', async () => {
    resetStream();
    const model = await startModel();
    // Headers travel with the first body chunk, so the backend sends one before we wait for them.
    pushStream('data: {"n":1}\n\n');
    const res = await request(`${model}/ng-rollout/s1/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...chat, stream: true }),
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toContain('text/event-stream');
    const it = res.body[Symbol.asyncIterator]();
    // Each chunk must reach us before the backend sends the next.
    expect(String((await it.next()).value)).toBe('data: {"n":1}\n\n');
    pushStream('data: {"n":2}\n\n');
    expect(String((await it.next()).value)).toBe('data: {"n":2}\n\n');
    pushStream('data: [DONE]\n\n');
    pushStream(null);
    let rest = '';
    for (let r = await it.next(); !r.done; r = await it.next()) rest += String(r.value);
    expect(rest).toBe('data: [DONE]\n\n');
    expect(seen[0]!.url).toBe('/ng-rollout/s1/v1/chat/completions');
  });

  it('relays the backend status and body of a refused call', async () => {
    const model = await startModel();
    const r = await post(`${model}/ng-rollout/r1/v1/chat/completions`, { ...chat, fail: true });
    expect(r.status).toBe(409);
    expect(r.json.error.code).toBe('stale_attempt');
  });

  it('proxies GET /v1/models, with and without a prefix', async () => {
    const model = await startModel();
    const a = await request(`${model}/v1/models`);
    expect(await a.body.json()).toEqual({ object: 'list', data: [{ id: 'fake-model', object: 'model' }] });
    const b = await request(`${model}/ng-rollout/r9/v1/models`);
    expect(b.statusCode).toBe(200);
    await b.body.dump();
    expect(seen.map((s) => s.url)).toEqual(['/v1/models', '/ng-rollout/r9/v1/models']);
  });

  it.each([
    '/ng-rollout/x-a1-a2/v1/chat/completions', // rollout part keeps a reserved suffix
    '/ng-rollout/-bad/v1/chat/completions', // first character not alphanumeric
    '/ng-rollout/a%20b/v1/chat/completions',
    '/ng-rollout//v1/chat/completions',
  ])('answers 400 invalid_rollout_id for a malformed prefix: %s', async (path) => {
    const model = await startModel();
    const r = await post(`${model}${path}`, chat);
    expect(r.status).toBe(400);
    expect(r.json.error.code).toBe('invalid_rollout_id');
    expect(seen).toHaveLength(0);
  });

  it('refuses a body without messages with invalid_request', async () => {
    const model = await startModel();
    const r = await post(`${model}/v1/chat/completions`, { model: 'x' });
    expect(r.status).toBe(400);
    expect(r.json.error.code).toBe('invalid_request');
    expect(seen).toHaveLength(0);
  });

  it('answers 502 backend_unavailable when the backend does not answer', async () => {
    const model = await startModel({ backend_url: 'http://127.0.0.1:9' });
    const r = await post(`${model}/ng-rollout/r1/v1/chat/completions`, chat);
    expect(r.status).toBe(502);
    expect(r.json.error.code).toBe('backend_unavailable');
  });
});

describe('the gate seam', { timeout: 10_000 }, () => {
  it('admits before forwarding, starts the response at the first data chunk (not an SSE comment), ends once', async () => {
    resetStream();
    const events: string[] = [];
    const gate: GenerationGate = {
      async admit(c: GenerationCall) {
        events.push(`admit ${c.key} ${c.episode?.rollout_id}/${c.episode?.attempt} ${c.route}`);
        return {
          backendBody: { ...c.body, ng_capture: { model_call_id: 'mc_1' } },
          signal: new AbortController().signal,
          deliver: async (s) => void events.push(`start ${s.status} ${s.stream}`),
          complete: async () => void events.push('complete'),
          end: () => void events.push('end'),
        };
      },
    };
    const app = createGymApp({ name: 'm', kind: 'model', logLevel: 'silent' });
    registerModelProxy(app, { backend: ours(), gate });
    apps.push(app);
    await app.listen({ host: '127.0.0.1', port: 0 });
    pushStream(': keep-alive\n\n');
    const res = await request(`http://127.0.0.1:${(app.server.address() as AddressInfo).port}/ng-rollout/g1-a1/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...chat, stream: true }),
    });
    const it = res.body[Symbol.asyncIterator]();
    await it.next();
    expect(events).toEqual(['admit g1-a1 g1/1 /v1/chat/completions']);
    // The backend got the gate's body.
    expect(JSON.parse(seen[0]!.body).ng_capture).toEqual({ model_call_id: 'mc_1' });
    pushStream('data: {"n":1}\n\n');
    await it.next();
    expect(events).toEqual(['admit g1-a1 g1/1 /v1/chat/completions', 'start 200 true']);
    pushStream(null);
    while (!(await it.next()).done);
    await sleep(20);
    expect(events).toEqual(['admit g1-a1 g1/1 /v1/chat/completions', 'start 200 true', 'complete', 'end']);
  });

  it('a refusal from the gate is the reply and nothing reaches the backend', async () => {
    const { refuse } = await import('../../protocol/errors.js');
    const app = createGymApp({ name: 'm', kind: 'model', logLevel: 'silent' });
    registerModelProxy(app, {
      backend: ours(),
      gate: {
        admit: async () => {
          throw refuse('stale_attempt', 'retired');
        },
      },
    });
    apps.push(app);
    const r = await app.inject({ method: 'POST', url: '/ng-rollout/r1/v1/chat/completions', payload: chat });
    expect(r.statusCode).toBe(409);
    expect(r.json().error.code).toBe('stale_attempt');
    expect(seen).toHaveLength(0);
  });

  it('a delivery the gate refuses (poisoned) sends no answer', async () => {
    const app = createGymApp({ name: 'm', kind: 'model', logLevel: 'silent' });
    registerModelProxy(app, {
      backend: ours(),
      gate: {
        admit: async (c) => ({
          backendBody: c.body,
          signal: new AbortController().signal,
          deliver: async () => {
            throw new Error('ledger write failed');
          },
          complete: async () => {},
          end: () => {},
        }),
      },
    });
    apps.push(app);
    await app.listen({ host: '127.0.0.1', port: 0 });
    const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/ng-rollout/r1/v1/chat/completions`;
    await expect(post(url, chat)).rejects.toThrow();
  });
});

describe('policy model options', () => {
  const parse = (o: unknown) => parseConfig(PolicyModelOptionsSchema, o, 'servers.policy_model.options');
  const keyOf = (o: unknown): string => {
    try {
      parse(o);
    } catch (err) {
      if (err instanceof ConfigError) return err.key;
      throw err;
    }
    return '(accepted)';
  };

  it('fills defaults', () => {
    expect(parse({ backend: 'b' })).toEqual({ backend: 'b', checkpoint_policy: false, checkpoint_generation_cuts: false });
  });

  it('errors name the key', () => {
    expect(keyOf({})).toBe('servers.policy_model.options.backend');
    expect(keyOf({ backend: 'b', backend_url: 'http://127.0.0.1:1' })).toBe('servers.policy_model.options.backend');
    expect(keyOf({ backend: 'b', temperature: 1 })).toBe('servers.policy_model.options.temperature');
    expect(keyOf({ backend_url: 'not a url' })).toBe('servers.policy_model.options.backend_url');
    expect(keyOf({ backend: 'b', checkpoint_policy: 'yes' })).toBe('servers.policy_model.options.checkpoint_policy');
    expect(keyOf({ backend: 'b', checkpoint_generation_cuts: true })).toBe('servers.policy_model.options.checkpoint_generation_cuts');
    expect(keyOf({ backend: 'b', checkpoint_policy: true, checkpoint_generation_cuts: true })).toBe('(accepted)');
  });

  it('a backend that is not an inference server in the deployment fails at build, naming the option', async () => {
    const ctx = contextFor({ backend: 'nope' });
    await expect(policyModel.build(ctx, parse({ backend: 'nope' }))).rejects.toThrow(/servers\.policy_model\.options\.backend: no server named 'nope'/);
    const ctx2 = contextFor({ backend: 'policy_model' });
    await expect(policyModel.build(ctx2, parse({ backend: 'policy_model' }))).rejects.toThrow(/expected inference/);
  });
});
