import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { Agent } from 'undici';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import type { EpisodeId } from '../../protocol/ids.js';
import type { ChatMessage } from '../../protocol/openai.js';
import { parseConfig } from '../../servers/common/config-error.js';
import { parseDeployment } from '../../servers/common/deployment.js';
import type { ServerContext } from '../../servers/common/server-context.js';
import { buildInferenceApp, type InferenceState } from '../../servers/inference/app.js';
import type { CallRecord } from '../../servers/inference/call-log.js';
import { initialWeights, type PolicyWeights } from '../../servers/inference/policy.js';
import { buildPolicyModel, PolicyModelOptionsSchema } from '../../servers/model/module.js';
import type { ModelParticipant } from '../../servers/model/participant.js';
import { tempDir } from '../helpers/temp-dir.js';
import { type HttpReply, httpJson } from '../helpers/http.js';

export type Reply = HttpReply;

export const TOKEN = 'model-participant-test-token';
export const AUTH = { authorization: `Bearer ${TOKEN}` };

/** Weights that make every episode deterministic: weather calls the right city once, then answers. */
export function decisiveWeights(version = 0): PolicyWeights {
  const w = initialWeights();
  w.version = version;
  w.logits['weather:calls=0'] = { call_right_city: 30, call_wrong_city: 0, answer: 0 };
  w.logits['weather:calls=1'] = { call_right_city: 0, call_wrong_city: 0, answer: 30 };
  for (let r = 1; r <= 6; r++) w.logits[`counter:remaining=${r}`] = { inc1: 30, inc2: 0, inc3: 0, answer: 0 };
  w.logits['counter:remaining=0'] = { inc1: 0, inc2: 0, inc3: 0, answer: 30 };
  return w;
}

export const SYSTEM: ChatMessage = { role: 'system', content: 'You are a helpful assistant.' };
export const weatherStart = (): ChatMessage[] => [SYSTEM, { role: 'user', content: 'How is the weather in SF?\n[task weather city=SF]' }];

/** The conversation after one tool round on `reply` (what the agent sends next). */
export function afterToolRound(messages: ChatMessage[], reply: any, output = '{"weather":"cold"}'): ChatMessage[] {
  const msg = reply.choices[0].message as ChatMessage;
  const call = msg.tool_calls![0]!;
  return [...messages, { role: 'assistant', content: null, tool_calls: msg.tool_calls }, { role: 'tool', tool_call_id: call.id, content: output }];
}

const cleanup: Array<() => Promise<void> | void> = [];

export async function closeFixtures(): Promise<void> {
  for (const c of cleanup.splice(0).reverse()) await c();
}

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ host: '127.0.0.1', port: 0 });
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
}

export interface TestBackend {
  app: FastifyInstance;
  state: InferenceState;
  url: string;
  calls(): CallRecord[];
}

export async function startBackend(opts: { tokenDelayMs?: number; weights?: PolicyWeights } = {}): Promise<TestBackend> {
  const { app, state } = await buildInferenceApp({
    name: 'policy_backend',
    logLevel: 'silent',
    tokenDelayMs: opts.tokenDelayMs ?? 0,
    weights: opts.weights ?? decisiveWeights(),
    controlToken: TOKEN,
  });
  const url = await listen(app);
  cleanup.push(async () => {
    state.holds.release();
    await app.close();
  });
  return { app, state, url, calls: () => state.log.list() };
}

export interface TestModel {
  app: FastifyInstance;
  participant: ModelParticipant;
  url: string;
  captureDir: string;
}

export function modelContext(backendUrl: string, options: Record<string, unknown>): ServerContext {
  const deployment = parseDeployment({
    checkpoint: { enabled: true, control_auth_token: TOKEN },
    servers: { policy_backend: { kind: 'inference' }, policy_model: { kind: 'model', options } },
  });
  return {
    name: 'policy_model',
    entry: deployment.servers.policy_model!,
    deployment,
    endpoints: { policy_backend: { kind: 'inference', url: backendUrl }, policy_model: { kind: 'model', url: 'http://127.0.0.1:1' } },
    checkpoint: deployment.checkpoint,
    sessionSecret: 'test-session-secret-0123456789',
    logLevel: 'silent',
  };
}

export async function startModel(backend: { url: string }, opts: { cuts?: boolean; captureDir?: string } = {}): Promise<TestModel> {
  const captureDir = opts.captureDir ?? tempDir('model-capture');
  const raw = { backend: 'policy_backend', checkpoint_policy: true, checkpoint_generation_cuts: opts.cuts ?? false, capture_dir: captureDir };
  const options = parseConfig(PolicyModelOptionsSchema, raw, 'servers.policy_model.options');
  const { app, participant } = await buildPolicyModel(modelContext(backend.url, raw), options);
  const url = await listen(app);
  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    await app.close();
  };
  cleanup.push(close);
  return { app, participant: participant!, url, captureDir };
}

/** Stops a model server (the crash of a test: its in-flight calls die with it). */
export async function stopModel(m: TestModel): Promise<void> {
  m.app.server.closeAllConnections();
  await m.app.close();
}

// --- calls ----------------------------------------------------------------------------------------

const pool = new Agent({ headersTimeout: 0, bodyTimeout: 0, connections: 64 });

export const http = (method: 'GET' | 'POST', url: string, body?: unknown, headers?: Record<string, string>): Promise<Reply> =>
  httpJson(pool, method, url, body, headers);

/** A chat call through the model server, under `/ng-rollout/<key>` when a key is given. */
export function chat(model: { url: string }, key: string | undefined, messages: ChatMessage[], extra: Record<string, unknown> = {}): Promise<Reply> {
  const path = key === undefined ? '/v1/chat/completions' : `/ng-rollout/${key}/v1/chat/completions`;
  return http('POST', `${model.url}${path}`, { model: 'policy', messages, ...extra });
}

/** A pending call whose outcome a test inspects later. */
export interface Pending {
  done: Promise<void>;
  reply?: Reply;
  error?: unknown;
  settled: boolean;
}

export function pending(p: Promise<Reply>): Pending {
  const h: Pending = { done: Promise.resolve(), settled: false };
  h.done = p.then(
    (r) => {
      h.reply = r;
      h.settled = true;
    },
    (err: unknown) => {
      h.error = err;
      h.settled = true;
    },
  );
  return h;
}

export async function control(model: TestModel, op: string, body?: Record<string, unknown>): Promise<Reply> {
  const r = await model.app.inject({
    method: op === 'status' ? 'GET' : 'POST',
    url: `${CONTROL_PREFIX}/${op}`,
    headers: AUTH,
    ...(body ? { payload: body } : {}),
  });
  return { status: r.statusCode, body: r.json() };
}

export const deadline = (s = 10): number => Date.now() / 1000 + s;
export const ep = (rollout_id: string, attempt = 0): EpisodeId => ({ rollout_id, attempt });

export async function closePool(): Promise<void> {
  await pool.close();
}
