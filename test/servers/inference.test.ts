// The tiny-policy backend over HTTP: OpenAI-shaped plain and SSE replies, the call log, holds,
// policy refits, typed 400s, abandoned held calls (real sockets on 127.0.0.1).
import http from 'node:http';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  ChatCompletionChunkSchema,
  ChatCompletionSchema,
  completionFromChunks,
  type ChatCompletion,
  type ChatCompletionChunk,
  type ChatMessage,
} from '../../protocol/openai.js';
import { ConfigError } from '../../servers/common/config-error.js';
import type { ServerContext } from '../../servers/common/server-context.js';
import { buildInferenceApp, type InferenceState } from '../../servers/inference/app.js';
import type { CallRecord } from '../../servers/inference/call-log.js';
import inferenceModule from '../../servers/inference/module.js';
import { initialWeights, logSoftmax } from '../../servers/inference/policy.js';
import { waitFor } from '../helpers/wait.js';
import { tempDir } from '../helpers/temp-dir.js';

const dev: ChatMessage = { role: 'developer', content: 'You are a helpful assistant.' };
const weather: ChatMessage[] = [dev, { role: 'user', content: 'How is the weather in SF?\n[task weather city=SF]' }];
const counter: ChatMessage[] = [dev, { role: 'user', content: 'Count.\n[task counter start=1 target=4]' }];

const path = (key?: string): string => (key ? `/ng-rollout/${key}/v1/chat/completions` : '/v1/chat/completions');

function parseSse(text: string): { chunks: ChatCompletionChunk[]; done: boolean } {
  const events = text.split('\n\n').filter((e) => e.length);
  const chunks: ChatCompletionChunk[] = [];
  let done = false;
  for (const e of events) {
    expect(e.startsWith('data: ')).toBe(true);
    const data = e.slice('data: '.length);
    if (data === '[DONE]') {
      done = true;
      continue;
    }
    expect(done).toBe(false);
    chunks.push(ChatCompletionChunkSchema.parse(JSON.parse(data)));
  }
  return { chunks, done };
}

describe('inference server (inject)', () => {
  let app: FastifyInstance;
  let state: InferenceState;

  beforeAll(async () => {
    ({ app, state } = await buildInferenceApp({ name: 'policy_backend', logLevel: 'silent' }));
    await app.ready();
  });
  afterAll(async () => {
    await app.close();
  });
  afterEach(async () => {
    await app.inject({ method: 'POST', url: '/_ctl/reset' });
    await app.inject({ method: 'POST', url: '/_ctl/policy', payload: initialWeights() });
  });

  const chat = (key: string | undefined, messages: ChatMessage[], extra: Record<string, unknown> = {}) =>
    app.inject({ method: 'POST', url: path(key), payload: { model: 'policy', messages, ...extra } });

  it('lists its model', async () => {
    const res = await app.inject({ method: 'GET', url: '/v1/models' });
    expect(res.json()).toMatchObject({ object: 'list', data: [{ id: 'tiny-policy', object: 'model' }] });
  });

  it('answers a plain call with a valid OpenAI reply, fake tokens and ng_policy', async () => {
    const res = await chat('wx-1', weather);
    expect(res.statusCode).toBe(200);
    const body = ChatCompletionSchema.parse(res.json());
    const choice = body.choices[0]!;
    const policy = body.ng_policy!;
    expect(policy.situation).toBe('weather:calls=0');
    expect(['call_right_city', 'call_wrong_city', 'answer']).toContain(policy.action);
    const call = choice.message.tool_calls?.[0];
    const text = call ? call.function.arguments : (choice.message.content as string);
    expect(choice.finish_reason).toBe(call ? 'tool_calls' : 'stop');
    if (call) expect(call).toMatchObject({ id: 'call_wx-1_0', type: 'function', function: { name: 'get_weather' } });
    const chars = Array.from(text);
    expect(choice.token_ids).toEqual(chars.map((c) => (c.codePointAt(0)! % 250) + 1));
    expect(choice.logprobs!.content!.map((l) => l.token)).toEqual(chars);
    expect(choice.logprobs!.content![0]!.logprob).toBe(policy.logprob);
    expect(choice.logprobs!.content!.slice(1).every((l) => l.logprob === 0)).toBe(true);
    const row = initialWeights().logits['weather:calls=0']!;
    const actions = ['call_right_city', 'call_wrong_city', 'answer'];
    expect(policy.logprob).toBeCloseTo(logSoftmax(actions.map((a) => row[a]!))[actions.indexOf(policy.action)]!, 12);
    expect(body.prompt_token_ids!.length).toBeGreaterThan(0);
    expect(body.usage).toEqual({
      prompt_tokens: body.prompt_token_ids!.length,
      completion_tokens: chars.length,
      total_tokens: body.prompt_token_ids!.length + chars.length,
    });
    expect(body.model).toBe('policy');
  });

  it('streams SSE chunks that fold into the plain reply', async () => {
    for (const [key, messages] of [
      ['wx-2', weather],
      ['ct-2', counter],
      ['gr-2', [{ role: 'user', content: '[task genrm prompt=p3]' }]],
    ] as const) {
      const plain = (await chat(key, [...messages])).json() as ChatCompletion;
      const res = await chat(key, [...messages], { stream: true });
      expect(res.statusCode).toBe(200);
      expect(res.headers['content-type']).toMatch(/^text\/event-stream/);
      const { chunks, done } = parseSse(res.body);
      expect(done).toBe(true);
      const tokens = plain.choices[0]!.token_ids!.length;
      expect(chunks.length).toBe(tokens + 1);
      expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
      expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe(plain.choices[0]!.finish_reason);
      const folded = ChatCompletionSchema.parse(completionFromChunks(chunks));
      expect(folded.choices[0]!.message.content ?? null).toEqual(plain.choices[0]!.message.content ?? null);
      expect(folded.choices[0]!.message.tool_calls).toEqual(plain.choices[0]!.message.tool_calls);
      expect(folded.choices[0]!.logprobs).toEqual(plain.choices[0]!.logprobs);
      expect(folded.choices[0]!.token_ids).toEqual(plain.choices[0]!.token_ids);
      expect(folded.usage).toEqual(plain.usage);
      expect(folded.prompt_token_ids).toEqual(plain.prompt_token_ids);
      expect(folded.ng_policy).toEqual(plain.ng_policy);
    }
    const calls = (await app.inject({ method: 'GET', url: '/_ctl/calls' })).json() as CallRecord[];
    expect(calls.map((c) => c.stream)).toEqual([false, true, false, true, false, true]);
    expect(calls.every((c) => c.returned === true)).toBe(true);
  });

  it('a replacement attempt makes the same call; the log keeps key, rollout and attempt', async () => {
    const a = (await chat('wx-9', weather)).json() as ChatCompletion;
    const b = (await chat('wx-9-a1', weather)).json() as ChatCompletion;
    expect(b.choices[0]!.message).toEqual(a.choices[0]!.message);
    expect(b.ng_policy).toEqual(a.ng_policy);
    await chat(undefined, weather);
    const calls = (await app.inject({ method: 'GET', url: '/_ctl/calls' })).json() as CallRecord[];
    expect(calls.map((c) => [c.index, c.capture_key, c.rollout_id, c.attempt, c.n_messages])).toEqual([
      [0, 'wx-9', 'wx-9', 0, 2],
      [1, 'wx-9-a1', 'wx-9', 1, 2],
      [2, 'anonymous', 'anonymous', 0, 2],
    ]);
    expect(calls[0]).toMatchObject({ situation: 'weather:calls=0', action: a.ng_policy!.action, version: 0, returned: true });
    expect(typeof calls[0]!.t).toBe('number');
    expect((await app.inject({ method: 'GET', url: '/_ctl/call_count' })).json()).toEqual({ count: 3 });
  });

  it('holds after a global call index until release, recording held calls on arrival', async () => {
    expect((await app.inject({ method: 'POST', url: '/_ctl/hold', payload: { after_calls: 1 } })).json()).toEqual({ ok: true });
    const first = await chat('h-1', weather);
    expect(first.statusCode).toBe(200);
    const second = chat('h-1', [...weather, { role: 'assistant', content: 'x' }, { role: 'user', content: 'more' }]);
    const third = chat('h-2', weather);
    await waitFor(() => state.holds.waiting === 2);
    const calls = (await app.inject({ method: 'GET', url: '/_ctl/calls' })).json() as CallRecord[];
    expect(calls.map((c) => c.n_messages)).toEqual([2, 4, 2]);
    expect(calls.map((c) => c.returned ?? false)).toEqual([true, false, false]);
    expect((await app.inject({ method: 'GET', url: '/_ctl/call_count' })).json()).toEqual({ count: 3 });
    expect((await app.inject({ method: 'POST', url: '/_ctl/release' })).json()).toEqual({ ok: true, released: 2 });
    expect((await second).statusCode).toBe(200);
    expect((await third).statusCode).toBe(200);
    // Released: no hold any more.
    expect((await chat('h-3', weather)).statusCode).toBe(200);
  });

  it('holds per rollout once the rollout (any attempt) made n calls', async () => {
    await app.inject({ method: 'POST', url: '/_ctl/hold', payload: { after_calls_per_rollout: 1 } });
    expect((await chat('a', weather)).statusCode).toBe(200);
    expect((await chat('b', weather)).statusCode).toBe(200);
    const a2 = chat('a', weather);
    const b2 = chat('b-a1', weather);
    await waitFor(() => state.holds.waiting === 2);
    expect((await chat('c', weather)).statusCode).toBe(200);
    // Placing a hold again keeps the calls already waiting.
    await app.inject({ method: 'POST', url: '/_ctl/hold', payload: { after_calls_per_rollout: 5 } });
    expect(state.holds.waiting).toBe(2);
    await app.inject({ method: 'POST', url: '/_ctl/release' });
    expect((await a2).statusCode).toBe(200);
    expect((await b2).statusCode).toBe(200);
  });

  it('reset clears the log and releases held calls', async () => {
    await app.inject({ method: 'POST', url: '/_ctl/hold', payload: { after_calls: 0 } });
    const held = chat('z', weather);
    await waitFor(() => state.holds.waiting === 1);
    expect((await app.inject({ method: 'POST', url: '/_ctl/reset' })).json()).toEqual({ ok: true, released: 1 });
    expect((await held).statusCode).toBe(200);
    expect((await app.inject({ method: 'GET', url: '/_ctl/call_count' })).json()).toEqual({ count: 0 });
  });

  it('loads new policy weights; a new version changes the sampling seed', async () => {
    expect((await app.inject({ method: 'GET', url: '/_ctl/policy' })).json()).toEqual(initialWeights());
    const before = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(`p-${i}`, weather).then((r) => r.json() as ChatCompletion)));
    const next = { version: 1, logits: initialWeights().logits };
    expect((await app.inject({ method: 'POST', url: '/_ctl/policy', payload: next })).json()).toEqual({ ok: true, version: 1 });
    expect((await app.inject({ method: 'GET', url: '/_ctl/policy' })).json()).toEqual(next);
    const after = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(`p-${i}`, weather).then((r) => r.json() as ChatCompletion)));
    expect(after.every((r) => r.ng_policy!.version === 1)).toBe(true);
    expect(after.every((r, i) => r.id !== before[i]!.id)).toBe(true);
    expect(after.some((r, i) => r.ng_policy!.action !== before[i]!.ng_policy!.action)).toBe(true);
    // Sharper logits change the behaviour itself.
    const sure = { version: 2, logits: { 'weather:calls=0': { call_right_city: 30, call_wrong_city: 0, answer: 0 } } };
    await app.inject({ method: 'POST', url: '/_ctl/policy', payload: sure });
    const r = (await chat('p-0', weather)).json() as ChatCompletion;
    expect(r.choices[0]!.message.tool_calls![0]!.function.arguments).toBe('{"city":"SF"}');
  });

  it('refuses bad bodies with typed 400s', async () => {
    const bad = async (url: string, payload: unknown, code = 'invalid_request') => {
      const res = await app.inject({ method: 'POST', url, payload: payload as object });
      expect(res.statusCode).toBe(400);
      expect(res.json().error.code).toBe(code);
      return res.json().error.detail as string;
    };
    expect(await bad('/v1/chat/completions', { messages: [] })).toMatch(/messages/);
    await bad('/v1/chat/completions', { model: 'x' });
    await bad('/v1/chat/completions', { messages: [{ content: 'no role' }] });
    await bad('/v1/chat/completions', { messages: weather, stream: 'yes' });
    await bad('/ng-rollout/x-a1-a2/v1/chat/completions', { messages: weather }, 'invalid_rollout_id');
    await bad('/_ctl/hold', { after_calls: -1 });
    await bad('/_ctl/hold', { after_calls: 1, after_calls_per_rollout: 1 });
    await bad('/_ctl/hold', {});
    expect(await bad('/_ctl/policy', { version: 1, logits: { 'weather:calls=9': {} } })).toMatch(/unknown situation/);
    await bad('/_ctl/policy', { version: 'one', logits: {} });
    await bad('/_ctl/policy', { version: 1, logits: { genrm: { answer_a: 'high' } } });
    const raw = await app.inject({ method: 'POST', url: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, payload: '{oops' });
    expect(raw.statusCode).toBe(400);
    expect(raw.json().error.code).toBe('invalid_request');
    // Nothing was logged or loaded.
    expect((await app.inject({ method: 'GET', url: '/_ctl/call_count' })).json()).toEqual({ count: 0 });
    expect((await app.inject({ method: 'GET', url: '/_ctl/policy' })).json()).toEqual(initialWeights());
    // Unknown request fields are allowed (lenient OpenAI subset).
    expect((await chat('ok', weather, { temperature: 0.7, logprobs: true, ng_capture: { x: 1 } })).statusCode).toBe(200);
  });

  it('a server closing while a call is held answers 503 instead of hanging', async () => {
    const { app: other } = await buildInferenceApp({ name: 'b2', logLevel: 'silent' });
    await other.inject({ method: 'POST', url: '/_ctl/hold', payload: { after_calls: 0 } });
    const held = other.inject({ method: 'POST', url: '/v1/chat/completions', payload: { messages: weather } });
    await waitFor(async () => (await other.inject({ method: 'GET', url: '/_ctl/call_count' })).json().count === 1);
    await other.close();
    const res = await held;
    expect(res.statusCode).toBe(503);
  });
});

describe('inference server (sockets)', () => {
  let app: FastifyInstance;
  let state: InferenceState;
  let port: number;

  beforeAll(async () => {
    ({ app, state } = await buildInferenceApp({ name: 'policy_backend', logLevel: 'silent', tokenDelayMs: 5 }));
    await app.listen({ host: '127.0.0.1', port: 0 });
    port = (app.server.address() as AddressInfo).port;
  });
  afterAll(async () => {
    await app.close();
  });

  /** Starts a POST and returns the request (to abort) and a promise of the first body bytes. */
  function post(url: string, body: unknown): { req: http.ClientRequest; firstData: Promise<string> } {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: url, headers: { 'content-type': 'application/json' } });
    const firstData = new Promise<string>((resolve, reject) => {
      req.on('response', (res) => res.once('data', (d: Buffer) => resolve(d.toString())));
      req.on('error', reject);
    });
    firstData.catch(() => undefined);
    req.end(JSON.stringify(body));
    return { req, firstData };
  }

  it('drops a held call whose client went away', async () => {
    await app.inject({ method: 'POST', url: '/_ctl/hold', payload: { after_calls: 0 } });
    const { req } = post(path('gone-1'), { messages: weather });
    await waitFor(() => state.holds.waiting === 1);
    req.destroy();
    await waitFor(() => state.holds.waiting === 0);
    await waitFor(() => state.log.list()[0]?.abandoned === true);
    expect(state.log.list()[0]!.returned).toBeUndefined();
    await app.inject({ method: 'POST', url: '/_ctl/reset' });
  });

  it('paces tokens by token_delay_ms and stops generating when a stream is abandoned', async () => {
    const start = Date.now();
    const full = await fetch(`http://127.0.0.1:${port}${path('slow-1')}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: weather, stream: true }),
    });
    const { chunks, done } = parseSse(await full.text());
    expect(done).toBe(true);
    expect(Date.now() - start).toBeGreaterThanOrEqual((chunks.length - 1) * 5 - 5);

    const { req, firstData } = post(path('slow-2'), { messages: [{ role: 'user', content: '[task genrm prompt=p0]' }], stream: true });
    expect(await firstData).toMatch(/^data: /);
    req.destroy();
    await waitFor(() => state.log.list().find((c) => c.capture_key === 'slow-2')?.abandoned === true);
    expect(state.log.list().find((c) => c.capture_key === 'slow-2')!.returned).toBeUndefined();
    // The server keeps serving.
    const ok = await fetch(`http://127.0.0.1:${port}/_ctl/call_count`);
    expect(await ok.json()).toEqual({ count: 2 });
  });
});

describe('inference module', () => {
  const ctx = { name: 'policy_backend', logLevel: 'silent' } as ServerContext;
  let dir: string;
  beforeAll(() => {
    dir = tempDir('inference', 'file');
  });

  it('validates options with defaults and names bad keys', () => {
    expect(inferenceModule.optionsSchema.parse({})).toEqual({ token_delay_ms: 0 });
    expect(inferenceModule.optionsSchema.parse({ seed: 1, token_delay_ms: 2 })).toEqual({ seed: 1, token_delay_ms: 2 });
    expect(inferenceModule.optionsSchema.safeParse({ sed: 1 }).success).toBe(false);
    expect(inferenceModule.optionsSchema.safeParse({ token_delay_ms: -1 }).success).toBe(false);
  });

  it('builds an app, salted by seed, starting from policy_file', async () => {
    const file = join(dir, 'w.json');
    writeFileSync(file, JSON.stringify({ version: 7, logits: { 'weather:calls=0': { call_right_city: 30 } } }));
    const app = await inferenceModule.build(ctx, { seed: 3, token_delay_ms: 0, policy_file: file });
    try {
      const res = await app.inject({ method: 'POST', url: path('m-1'), payload: { messages: weather } });
      expect(res.json().ng_policy).toMatchObject({ version: 7, action: 'call_right_city' });
      const plain = await inferenceModule.build(ctx, { token_delay_ms: 0 });
      const salted = await inferenceModule.build(ctx, { seed: 3, token_delay_ms: 0 });
      const ids = await Promise.all(
        [plain, salted].map(async (a) => (await a.inject({ method: 'POST', url: path('m-1'), payload: { messages: weather } })).json().id),
      );
      expect(ids[0]).not.toBe(ids[1]);
      await plain.close();
      await salted.close();
    } finally {
      await app.close();
    }
  });

  it('a bad policy_file is a config error naming the key', async () => {
    const file = join(dir, 'bad.json');
    writeFileSync(file, JSON.stringify({ version: 1, logits: { nope: {} } }));
    await expect(inferenceModule.build(ctx, { token_delay_ms: 0, policy_file: file })).rejects.toThrow(ConfigError);
    await expect(inferenceModule.build(ctx, { token_delay_ms: 0, policy_file: join(dir, 'missing.json') })).rejects.toThrow(
      /servers\.policy_backend\.options\.policy_file/,
    );
  });
});
