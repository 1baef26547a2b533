// The tiny-policy backend's generation-cut service (servers/inference/cuts.ts; participants.md
// §5.6, §6.3) over HTTP: staging the prefix of a call still decoding, the receipt (checked with the
// model server's own strict validator), the cut rounds log, and continuations — accepted ones
// decode only the rest, refused ones decode from scratch.
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { Agent, request } from 'undici';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ChatMessage } from '../../protocol/openai.js';
import { buildInferenceApp, type InferenceState } from '../../servers/inference/app.js';
import type { CallRecord } from '../../servers/inference/call-log.js';
import { initialWeights } from '../../servers/inference/policy.js';
import { buildInventory, GENERATION_CUT_PATH, validateReceipt, type GenerationCutContinuation } from '../../servers/model/cut-wire.js';
import { waitFor } from '../helpers/wait.js';

const TOKEN = 'cut-token';
const pool = new Agent({ headersTimeout: 0, bodyTimeout: 0 });
const weather: ChatMessage[] = [
  { role: 'system', content: 'You are helpful.' },
  { role: 'user', content: 'How is the weather in SF?\n[task weather city=SF]' },
];

let app: FastifyInstance;
let state: InferenceState;
let url: string;

/** Weights whose first weather call answers at once (a long text: many tokens to cut). */
function answering(version: number) {
  const w = initialWeights();
  w.version = version;
  w.logits['weather:calls=0'] = { call_right_city: 0, call_wrong_city: 0, answer: 30 };
  return w;
}

beforeEach(async () => {
  ({ app, state } = await buildInferenceApp({ name: 'policy_backend', logLevel: 'silent', tokenDelayMs: 15, weights: answering(3), controlToken: TOKEN }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
});
afterEach(async () => {
  state.holds.release();
  await app.close();
});
afterAll(async () => {
  await pool.close();
});

async function post(path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const res = await request(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    dispatcher: pool,
  });
  const text = await res.body.text();
  return { status: res.statusCode, body: text ? JSON.parse(text) : undefined };
}

const calls = (): CallRecord[] => state.log.list();
const capture = (key: string, id: string, extra: Record<string, unknown> = {}) => ({
  rollout_id: key.replace(/-a\d+$/, ''),
  model_call_id: id,
  mode: 'text',
  ...extra,
});
const chat = (key: string, id: string, messages = weather, extra: Record<string, unknown> = {}) =>
  post(`/ng-rollout/${key}/v1/chat/completions`, { model: 'policy', messages, ng_capture: capture(key, id, extra) });

async function waitDecoded(index: number, n: number): Promise<void> {
  await waitFor(`call ${index} to decode ${n} tokens`, () => (calls()[index]?.decoded_tokens ?? 0) >= n, 5_000);
}

const inventoryFor = (id: string, rollout = 'wx', attempt = 0) =>
  buildInventory('ckpt-1', 'policy_model', [{ ticket_id: 'a'.repeat(32), rollout_id: rollout, attempt, model_call_id: id, admitted_at: 1767225600.25 }]);

/** Cuts `mc_1` of rollout wx while it decodes; returns the continuation and the original reply. */
async function cutOne(): Promise<{ continuation: GenerationCutContinuation; original: any; prefix: number }> {
  const running = chat('wx', 'mc_1');
  await waitDecoded(0, 4);
  const inv = inventoryFor('mc_1');
  const r = await post(GENERATION_CUT_PATH, inv, { authorization: `Bearer ${TOKEN}` });
  expect(r.status).toBe(200);
  const [outcome] = validateReceipt(inv, r.body);
  expect(outcome!.disposition).toBe('durable_prefix');
  const original = (await running).body;
  if (outcome!.disposition !== 'durable_prefix') throw new Error('unreachable');
  return {
    continuation: { source_capture_key: 'wx', source_model_call_id: 'mc_1', ...outcome!.continuation },
    original,
    prefix: outcome!.continuation.prefix_token_count,
  };
}

describe('generation-cut service', { timeout: 20_000 }, () => {
  it('needs the bearer token and a well-formed inventory with its digest', async () => {
    const inv = inventoryFor('mc_x');
    expect((await post(GENERATION_CUT_PATH, inv)).status).toBe(401);
    expect((await post(GENERATION_CUT_PATH, inv, { authorization: 'Bearer nope' })).status).toBe(401);
    const bad = await post(GENERATION_CUT_PATH, { ...inv, inventory_digest: 'f'.repeat(64) }, { authorization: `Bearer ${TOKEN}` });
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe('invalid_request');
    expect((await post(GENERATION_CUT_PATH, { checkpoint_id: 'x' }, { authorization: `Bearer ${TOKEN}` })).status).toBe(400);
  });

  it('stages the prefix of a call still decoding and lets it finish; unknown or unstarted calls are durable failures', async () => {
    const running = chat('wx', 'mc_1');
    state.holds.place({ after_calls: 1 });
    const held = chat('other', 'mc_held');
    await waitDecoded(0, 5);
    const inv = buildInventory('ckpt-1', 'policy_model', [
      { ticket_id: 'a'.repeat(32), rollout_id: 'wx', attempt: 0, model_call_id: 'mc_1', admitted_at: 1 },
      { ticket_id: 'b'.repeat(32), rollout_id: 'other', attempt: 0, model_call_id: 'mc_held', admitted_at: 2 },
      { ticket_id: 'c'.repeat(32), rollout_id: 'gone', attempt: 0, model_call_id: 'mc_gone', admitted_at: 3 },
      // Right call ID, wrong attempt: not the call the inventory means.
      { ticket_id: 'd'.repeat(32), rollout_id: 'wx', attempt: 1, model_call_id: 'mc_1', admitted_at: 4 },
    ]);
    const r = await post(GENERATION_CUT_PATH, inv, { authorization: `Bearer ${TOKEN}` });
    expect(r.status).toBe(200);
    const outcomes = validateReceipt(inv, r.body);
    expect(outcomes.map((o) => o.disposition)).toEqual(['durable_prefix', 'durable_failure', 'durable_failure', 'durable_failure']);
    const ack = r.body.prefixes[0];
    expect(ack).toMatchObject({
      cut_kind: 'active_prefix',
      staging_keys: ['__generation_cut__/wx/mc_1'],
      effective_output_limit: 1024,
      terminal_finish_reason: null,
    });
    expect(ack.prefix_token_count).toBeGreaterThanOrEqual(5);
    expect(r.body.backend_snapshot_id).toBe('tiny-policy-cut-store');
    expect(await (await request(`${url}/_ctl/cuts`, { dispatcher: pool })).body.json()).toEqual([['mc_1']]);
    // Cutting does not stop the call.
    const reply = await running;
    expect(reply.status).toBe(200);
    expect(calls()[0]!.decoded_tokens).toBe(reply.body.choices[0].token_ids.length);
    state.holds.release();
    await held;
  });

  it('a continuation decodes only the rest and returns the same completion', async () => {
    const { continuation, original, prefix } = await cutOne();
    const r = await chat('wx-a1', 'mc_2', weather, { generation_cut: continuation });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].message).toEqual(original.choices[0].message);
    expect(r.body.choices[0].token_ids).toEqual(original.choices[0].token_ids);
    const log = calls()[1]!;
    expect(log).toMatchObject({ continued_from: 'mc_1', reused_prefix_tokens: prefix, model_call_id: 'mc_2' });
    expect(log.decoded_tokens).toBe(original.choices[0].token_ids.length - prefix);
    expect(log.admission).toMatchObject({ model_call_id: 'mc_2', generation_cut: continuation });
  });

  it('a streamed continuation sends the reused prefix first, then decodes the rest', async () => {
    const { continuation, original, prefix } = await cutOne();
    const res = await request(`${url}/ng-rollout/wx-a1/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'policy', messages: weather, stream: true, ng_capture: capture('wx-a1', 'mc_3', { generation_cut: continuation }) }),
      dispatcher: pool,
    });
    const events = (await res.body.text())
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => JSON.parse(e.slice(6)));
    const ids = events.flatMap((e) => e.choices[0].token_ids ?? []);
    expect(ids).toEqual(original.choices[0].token_ids);
    expect(calls()[1]).toMatchObject({ continued_from: 'mc_1', reused_prefix_tokens: prefix, stream: true });
    expect(calls()[1]!.decoded_tokens).toBe(original.choices[0].token_ids.length - prefix);
  });

  it.each<[string, (c: GenerationCutContinuation) => { key?: string; messages?: ChatMessage[]; cut: unknown; policy?: number }, RegExp]>([
    ['an unknown staging key', (c) => ({ cut: { ...c, staging_keys: ['__generation_cut__/wx/mc_9'] } }), /unknown staging key/],
    ['a wrong digest', (c) => ({ cut: { ...c, prefix_digest: '0'.repeat(64) } }), /digest/],
    ['another source call', (c) => ({ cut: { ...c, source_model_call_id: 'mc_7' } }), /another model call/],
    ['another rollout', (c) => ({ key: 'zz-a1', cut: c }), /another rollout/],
    ['other prompt tokens', (c) => ({ messages: [weather[0]!, { role: 'user', content: 'Other.\n[task weather city=SF]' }], cut: c }), /other prompt tokens/],
    ['a prefix of a newer policy', (c) => ({ cut: c, policy: 2 }), /newer than ours/],
    ['a malformed continuation', () => ({ cut: { nope: 1 } }), /malformed/],
  ])('refuses to continue %s and decodes from scratch', async (_what, make, reason) => {
    const { continuation, original } = await cutOne();
    const m = make(continuation);
    if (m.policy !== undefined) expect((await post('/_ctl/policy', answering(m.policy))).status).toBe(200);
    const r = await chat(m.key ?? 'wx-a1', 'mc_2', m.messages ?? weather, { generation_cut: m.cut });
    expect(r.status).toBe(200);
    const log = calls()[1]!;
    expect(log.continued_from).toBeUndefined();
    expect(log.continuation_rejected).toMatch(reason);
    expect(log.decoded_tokens).toBe(r.body.choices[0].token_ids.length);
    if (m.messages === undefined && m.key === undefined) expect(r.body.choices[0].token_ids).toEqual(original.choices[0].token_ids);
  });
});
