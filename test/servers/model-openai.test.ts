// The policy model server in front of a third-party OpenAI-compatible backend (`backend_api:
// openai`, servers/model/backend.ts): the backend sees plain OpenAI calls (no /ng-rollout prefix,
// no ng_* fields, the served model's name, the API key from the environment), streams pass
// through, failures are typed (4xx: the caller's error; 5xx, no answer, timeouts: retryable) and
// capture nothing, and a reply without token IDs is captured as text. The backend here is a small
// recording HTTP server; test/e2e/llama/ runs the same against llama.cpp's own server.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type ConfigError, parseConfig } from '../../servers/common/config-error.js';
import { closeDataAgent } from '../../servers/common/http-client.js';
import { downDeployment, upDeployment } from '../../servers/launcher/launcher.js';
import { buildPolicyModel, PolicyModelOptionsSchema } from '../../servers/model/module.js';
import { listStagingKeys, readLedgerRows, readStagedTokens } from '../../servers/model/token-store.js';
import { AUTH, closeFixtures, control, deadline, ep, modelContext, TOKEN } from './model-fixtures.js';
import { tempDir } from '../helpers/temp-dir.js';

// --- a recording third-party backend ----------------------------------------------------------------

interface Seen {
  method: string;
  url: string;
  authorization: string | undefined;
  body: any;
}

type Behaviour = (req: IncomingMessage, res: ServerResponse, body: any) => void | Promise<void>;

let backend: Server;
let backendUrl: string;
const seen: Seen[] = [];

const completion = (extra: Record<string, unknown> = {}, choice: Record<string, unknown> = {}) => ({
  id: 'chatcmpl-1',
  object: 'chat.completion',
  created: 1,
  model: 'served-smol',
  choices: [{ index: 0, message: { role: 'assistant', content: 'It is cold.' }, finish_reason: 'stop', ...choice }],
  usage: { prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 },
  ...extra,
});

const plain: Behaviour = (_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(completion()));
let behave: Behaviour = plain;

beforeAll(async () => {
  backend = createServer((req, res) => {
    void (async () => {
      let text = '';
      for await (const c of req) text += c;
      seen.push({ method: req.method ?? '', url: req.url ?? '', authorization: req.headers.authorization, body: text ? JSON.parse(text) : undefined });
      await behave(req, res, text ? JSON.parse(text) : undefined);
    })();
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  backendUrl = `http://127.0.0.1:${(backend.address() as AddressInfo).port}`;
});
afterAll(async () => {
  backend.closeAllConnections();
  await new Promise((r) => backend.close(r));
  await closeDataAgent();
  await closeFixtures();
});

const apps: FastifyInstance[] = [];
afterEach(async () => {
  seen.length = 0;
  behave = plain;
  await Promise.all(apps.splice(0).map((a) => a.close()));
});

const KEY_ENV = 'MODEL_OPENAI_TEST_KEY';
const SECRET = 'sk-test-3f9a0c1d2e';

interface Started {
  url: string;
  app: FastifyInstance;
  captureDir: string;
}

async function startModel(options: Record<string, unknown> = {}, env: NodeJS.ProcessEnv = { [KEY_ENV]: SECRET }): Promise<Started> {
  const captureDir = tempDir('model-openai');
  const raw = {
    backend_url: `${backendUrl}/v1`,
    backend_api: 'openai',
    served_model: 'served-smol',
    api_key_env: KEY_ENV,
    checkpoint_policy: true,
    capture_dir: captureDir,
    ...options,
  };
  const opts = parseConfig(PolicyModelOptionsSchema, raw, 'servers.policy_model.options');
  const saved = { ...process.env };
  Object.assign(process.env, env);
  try {
    const { app } = await buildPolicyModel(modelContext('http://127.0.0.1:1', raw), opts);
    apps.push(app);
    await app.listen({ host: '127.0.0.1', port: 0 });
    return { app, captureDir, url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}` };
  } finally {
    for (const k of Object.keys(env)) if (!(k in saved)) delete process.env[k];
  }
}

const messages = [
  { role: 'system', content: 'You answer weather questions.' },
  { role: 'user', content: 'How is the weather in SF?' },
];

async function post(url: string, body: unknown): Promise<{ status: number; json: any; text: string; headers: Record<string, unknown> }> {
  const res = await request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await res.body.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.statusCode, json, text, headers: res.headers };
}

const callAs = (m: Started, key: string, extra: Record<string, unknown> = {}) =>
  post(`${m.url}/ng-rollout/${key}/v1/chat/completions`, { model: 'policy', messages, ...extra });

// --- the request the backend sees ---------------------------------------------------------------------

describe('a third-party backend sees plain OpenAI calls', { timeout: 15_000 }, () => {
  it('no rollout prefix, no ng_capture, the served model name, the API key as a bearer token', async () => {
    const m = await startModel({ extra_body: { return_token_ids: true } });
    const r = await callAs(m, 'wx-17-a1', { temperature: 0 });
    expect(r.status).toBe(200);
    expect(r.json.choices[0].message.content).toBe('It is cold.');
    expect(seen).toHaveLength(1);
    expect(seen[0]!.url).toBe('/v1/chat/completions');
    expect(seen[0]!.authorization).toBe(`Bearer ${SECRET}`);
    // The participant added ng_capture for our own ledger; the backend never sees it.
    expect(seen[0]!.body).toEqual({ model: 'served-smol', messages, temperature: 0, return_token_ids: true });
  });

  it('a base URL without /v1, or with a path of its own, keeps its path', async () => {
    const a = await startModel({ backend_url: backendUrl });
    await callAs(a, 'r1');
    const b = await startModel({ backend_url: `${backendUrl}/openai/v1/` });
    await callAs(b, 'r2');
    expect(seen.map((s) => s.url)).toEqual(['/v1/chat/completions', '/openai/v1/chat/completions']);
  });

  it('GET /v1/models goes unprefixed and authorized', async () => {
    behave = (_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[{"id":"served-smol"}]}');
    const m = await startModel();
    const r = await request(`${m.url}/ng-rollout/r9/v1/models`);
    expect(await r.body.json()).toEqual({ object: 'list', data: [{ id: 'served-smol' }] });
    expect(seen.map((s) => [s.url, s.authorization])).toEqual([['/v1/models', `Bearer ${SECRET}`]]);
  });

  it('without api_key_env no Authorization header is sent', async () => {
    const m = await startModel({ api_key_env: undefined }, {});
    await callAs(m, 'r1');
    expect(seen[0]!.authorization).toBeUndefined();
  });

  it('streams SSE chunks through and captures the streamed text', async () => {
    let release!: () => void;
    const second = new Promise<void>((r) => (release = r));
    behave = async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(
        `data: ${JSON.stringify({ id: 's1', object: 'chat.completion.chunk', created: 1, model: 'served-smol', choices: [{ index: 0, delta: { role: 'assistant', content: 'It is ' } }] })}\n\n`,
      );
      await second;
      res.write(
        `data: ${JSON.stringify({ id: 's1', object: 'chat.completion.chunk', created: 1, model: 'served-smol', choices: [{ index: 0, delta: { content: 'cold.' }, finish_reason: 'stop' }] })}\n\n`,
      );
      res.end('data: [DONE]\n\n');
    };
    const m = await startModel();
    const res = await request(`${m.url}/ng-rollout/st-1/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'policy', messages, stream: true }),
    });
    expect(res.headers['content-type']).toContain('text/event-stream');
    const it = res.body[Symbol.asyncIterator]();
    // The first chunk arrives while the backend still holds the second: nothing is buffered.
    expect(String((await it.next()).value)).toContain('"It is "');
    release();
    let rest = '';
    for (let r = await it.next(); !r.done; r = await it.next()) rest += String(r.value);
    expect(rest).toContain('"cold."');
    expect(rest).toContain('[DONE]');
    expect(seen[0]!.body.stream).toBe(true);
    const [key] = await listStagingKeys(m.captureDir, 'st-1');
    const staged = await readStagedTokens(m.captureDir, key!);
    expect(staged).toMatchObject({
      capture: 'text',
      completion_token_ids: null,
      complete: true,
      finish_reason: 'stop',
      completion_message: { role: 'assistant', content: 'It is cold.' },
    });
  });
});

// --- what is captured -----------------------------------------------------------------------------------

describe('capture of a third-party reply', { timeout: 15_000 }, () => {
  it('a reply without token IDs is captured as text: the prompt messages and the assistant message', async () => {
    const m = await startModel();
    expect((await callAs(m, 'tx-1')).status).toBe(200);
    const rows = await readLedgerRows(m.captureDir, 'tx-1');
    expect(rows).toHaveLength(1);
    const staged = await readStagedTokens(m.captureDir, rows[0]!.staging_key as string);
    expect(staged).toMatchObject({
      capture: 'text',
      prompt_token_ids: null,
      completion_token_ids: null,
      prompt_messages: messages,
      completion_message: { role: 'assistant', content: 'It is cold.' },
    });
  });

  it('vLLM-style token IDs are captured as tokens (the prompt messages are not kept then)', async () => {
    behave = (_req, res) =>
      void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(completion({ prompt_token_ids: [1, 2, 3] }, { token_ids: [7, 8] })));
    const m = await startModel();
    await callAs(m, 'tk-1');
    const [key] = await listStagingKeys(m.captureDir, 'tk-1');
    const staged = await readStagedTokens(m.captureDir, key!);
    expect(staged).toMatchObject({ capture: 'tokens', prompt_token_ids: [1, 2, 3], completion_token_ids: [7, 8] });
    expect(staged!.prompt_messages).toBeUndefined();
  });

  it('logprobs that spell token IDs (`token_id:<n>`) are captured as tokens', async () => {
    const logprobs = {
      content: [
        { token: 'token_id:42', logprob: -0.5 },
        { token: 'token_id:7', logprob: -0.25 },
      ],
    };
    behave = (_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(completion({}, { logprobs })));
    const m = await startModel();
    await callAs(m, 'tl-1');
    const [key] = await listStagingKeys(m.captureDir, 'tl-1');
    expect(await readStagedTokens(m.captureDir, key!)).toMatchObject({ capture: 'tokens', completion_token_ids: [42, 7], completion_logprobs: [-0.5, -0.25] });
  });

  it('discovery (status) reports the backend: a third-party server is never cut', async () => {
    const m = await startModel();
    const st = await control({ app: m.app } as never, 'status');
    expect(st.body.backend).toEqual({ api: 'openai', generation_cuts: false });
  });
});

// --- failures ----------------------------------------------------------------------------------------------

describe('backend failures are typed and capture nothing', { timeout: 15_000 }, () => {
  it('a 4xx is the caller’s error: backend_rejected with the same status and the backend’s message', async () => {
    behave = (_req, res) =>
      void res
        .writeHead(400, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: { message: 'context length exceeded', type: 'invalid_request_error' } }));
    const m = await startModel();
    const r = await callAs(m, 'f4-1');
    expect(r.status).toBe(400);
    expect(r.json.error.code).toBe('backend_rejected');
    expect(r.json.error.detail).toContain('context length exceeded');
    expect(await readLedgerRows(m.captureDir, 'f4-1')).toEqual([]);
    expect(await listStagingKeys(m.captureDir, 'f4-1')).toEqual([]);
  });

  it('a 401 keeps its status (a wrong key is not retried)', async () => {
    behave = (_req, res) => void res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":{"message":"bad key"}}');
    const m = await startModel();
    const r = await callAs(m, 'f401');
    expect([r.status, r.json.error.code]).toEqual([401, 'backend_rejected']);
  });

  it('a 5xx is retryable: backend_unavailable (502)', async () => {
    behave = (_req, res) => void res.writeHead(503, { 'content-type': 'text/plain' }).end('overloaded');
    const m = await startModel();
    const r = await callAs(m, 'f5-1');
    expect([r.status, r.json.error.code]).toEqual([502, 'backend_unavailable']);
    expect(r.json.error.detail).toContain('HTTP 503: overloaded');
    expect(await readLedgerRows(m.captureDir, 'f5-1')).toEqual([]);
  });

  it('a reset connection is retryable: backend_unavailable', async () => {
    behave = (req) => void req.socket.destroy();
    const m = await startModel();
    const r = await callAs(m, 'fr-1');
    expect([r.status, r.json.error.code]).toEqual([502, 'backend_unavailable']);
    expect(await readLedgerRows(m.captureDir, 'fr-1')).toEqual([]);
  });

  it('no answer within request_timeout_s is retryable: backend_timeout (504)', async () => {
    behave = () => undefined; // never answers
    const m = await startModel({ request_timeout_s: 0.3 });
    const t0 = Date.now();
    const r = await callAs(m, 'ft-1');
    expect([r.status, r.json.error.code]).toEqual([504, 'backend_timeout']);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(await readLedgerRows(m.captureDir, 'ft-1')).toEqual([]);
  });

  it('an unreachable backend is backend_unavailable', async () => {
    const m = await startModel({ backend_url: 'http://127.0.0.1:9/v1' });
    const r = await callAs(m, 'fu-1');
    expect([r.status, r.json.error.code]).toEqual([502, 'backend_unavailable']);
  });
});

// --- configuration -----------------------------------------------------------------------------------------

describe('backend configuration', () => {
  const keyOf = (o: Record<string, unknown>): string => {
    try {
      parseConfig(PolicyModelOptionsSchema, o, 'servers.policy_model.options');
    } catch (err) {
      return (err as ConfigError).key;
    }
    return 'ok';
  };

  it('names the key that is wrong', () => {
    expect(keyOf({ backend_url: 'http://127.0.0.1:1', backend_api: 'openai' })).toBe('servers.policy_model.options.served_model');
    expect(
      keyOf({ backend_url: 'http://127.0.0.1:1', backend_api: 'openai', served_model: 'm', checkpoint_policy: true, checkpoint_generation_cuts: true }),
    ).toBe('servers.policy_model.options.checkpoint_generation_cuts');
    expect(keyOf({ backend_url: 'http://127.0.0.1:1', backend_api: 'openai', served_model: 'm', api_key_env: 'not a name' })).toBe(
      'servers.policy_model.options.api_key_env',
    );
    expect(keyOf({ backend: 'policy_backend', extra_body: { a: 1 } })).toBe('servers.policy_model.options.extra_body');
    expect(keyOf({ backend_url: 'http://127.0.0.1:1', backend_api: 'openai', served_model: 'm', api_key_env: 'K', request_timeout_s: 5 })).toBe('ok');
  });

  it('a named API key variable that is not set fails the start, naming the key', async () => {
    await expect(startModel({ api_key_env: 'MODEL_OPENAI_TEST_UNSET' }, {})).rejects.toThrow(
      'servers.policy_model.options.api_key_env: the environment variable MODEL_OPENAI_TEST_UNSET is not set',
    );
  });
});

// --- the key stays out of logs, status and checkpoints (a real server process) ---------------------------

describe('the API key in a real model server process', { timeout: 60_000 }, () => {
  it('reaches the backend and appears in no log line, status reply or checkpoint file', async () => {
    const dir = tempDir('model-openai-proc');
    const config = join(dir, 'gym.yaml');
    writeFileSync(
      config,
      [
        'checkpoint: { enabled: true }',
        'servers:',
        `  policy_model: { kind: model, options: { backend_url: "${backendUrl}/v1", backend_api: openai, served_model: served-smol, api_key_env: ${KEY_ENV}, checkpoint_policy: true } }`,
        '',
      ].join('\n'),
    );
    const runDir = join(dir, 'run');
    const up = await upDeployment({ config, runDir, env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'debug', [KEY_ENV]: SECRET }, healthTimeoutMs: 30_000 });
    try {
      const url = up.endpoints.policy_model!.url;
      expect((await post(`${url}/ng-rollout/pk-1/v1/chat/completions`, { model: 'policy', messages })).status).toBe(200);
      behave = (_req, res) => void res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":{"message":"bad key"}}');
      expect((await post(`${url}/ng-rollout/pk-2/v1/chat/completions`, { model: 'policy', messages })).status).toBe(401);
      behave = (req) => void req.socket.destroy();
      expect((await post(`${url}/ng-rollout/pk-3/v1/chat/completions`, { model: 'policy', messages })).status).toBe(502);
      expect(seen.map((s) => s.authorization)).toEqual([`Bearer ${SECRET}`, `Bearer ${SECRET}`, `Bearer ${SECRET}`]);

      const status = await request(`${url}/ng-control/v1/checkpoint/status`, { headers: AUTH });
      const statusText = await status.body.text();
      expect(statusText).toContain('"api":"openai"');
      // A checkpoint of the episode that made a call: its files name no key.
      const ckpt = join(dir, 'ckpt');
      mkdirSync(ckpt, { recursive: true });
      const ctl = async (op: string, body: unknown) => {
        const r = await request(`${url}/ng-control/v1/checkpoint/${op}`, {
          method: 'POST',
          headers: { ...AUTH, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        expect(r.statusCode).toBe(200);
        await r.body.dump();
      };
      await ctl('prepare', { checkpoint_id: 'k1', deadline_ts: deadline() });
      await ctl('commit', { checkpoint_id: 'k1', deadline_ts: deadline(), checkpoint_dir: ckpt, episode_ids: [ep('pk-1')] });
      await ctl('resume', { checkpoint_id: 'k1', deadline_ts: deadline() });

      const files = (d: string): string[] =>
        readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(d, e.name)) : [join(d, e.name)]));
      const checkpointFiles = files(ckpt);
      expect(checkpointFiles.length).toBeGreaterThan(0);
      const log = readFileSync(join(runDir, 'logs', 'policy_model.log'), 'utf8');
      expect(log).toContain('the backend refused a generation call'); // the failures were logged…
      expect(log).toContain('the backend did not answer');
      for (const [what, text] of [['log', log], ['status', statusText], ...checkpointFiles.map((f) => [f, readFileSync(f, 'utf8')])] as const) {
        expect(text.includes(SECRET), `${what} holds the API key`).toBe(false); // …without the key
      }
    } finally {
      await downDeployment(runDir, { graceMs: 2_000 });
    }
  });
});
