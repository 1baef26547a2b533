// The policy model server's backend: where a call goes and in what form.
//
// Two kinds of backend (option `backend_api`):
// - `ng`: ours (servers/inference, kind `inference`). It reads our request extensions: the call
//   goes under the caller's `/ng-rollout/<key>` prefix, the body keeps `ng_capture`, and it serves
//   the generation-cut service (§5.6). No credentials, no time limit (a test hold may last long).
// - `openai`: any OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API). It sees a plain
//   OpenAI request: `<base>/v1/...` without our prefix, no `ng_*` body fields, the served model's
//   name in `model`, `Authorization: Bearer <key>` with the key read from the environment variable
//   the config names (the key itself is never in a config, a log, a status or a checkpoint), and
//   `extra_body` merged in (e.g. vLLM's `return_token_ids`). It cannot continue a generation from
//   a token prefix, so it is never cut: prepare holds what it answers, as without cuts.
//
// Failures become typed errors (protocol/errors.ts): no answer, a reset or a 5xx is
// `backend_unavailable` (retryable), no answer in time `backend_timeout` (retryable), a 4xx
// `backend_rejected` with the backend's status (the caller's error). Our own backend's replies are
// relayed as they are: its refusals already carry our envelope.
import type { IncomingHttpHeaders } from 'node:http';
import { Agent, errors as undiciErrors, request, type Dispatcher } from 'undici';
import { ProtocolError, refuse } from '../../protocol/errors.js';
import { rolloutPath, type CaptureKey } from '../../protocol/ids.js';
import { ConfigError } from '../common/config-error.js';
import { dataAgent, joinPath } from '../common/http-client.js';

export type BackendApi = 'ng' | 'openai';

export interface Backend {
  api: BackendApi;
  /** Base URL without a trailing `/v1`: calls go to `<root>[/ng-rollout/<key>]/v1/...`. */
  root: string;
  /** Sent as the request's `model` (openai); undefined keeps the caller's. */
  servedModel: string | undefined;
  /** Merged into every generation request body (openai). */
  extraBody: Record<string, unknown>;
  /** Bound on the backend's answer (headers, then each body chunk); undefined: none. */
  timeoutMs: number | undefined;
  /** Generation cuts (§5.6) need a backend that continues from a token prefix: ours. */
  canCut: boolean;
  /** The `Authorization` header value; kept off every enumerable property so no log prints it. */
  authorization(): string | undefined;
}

export interface BackendConfig {
  /** `ng` | `openai`. */
  api: BackendApi;
  url: string;
  apiKeyEnv?: string | undefined;
  servedModel?: string | undefined;
  extraBody?: Record<string, unknown> | undefined;
  requestTimeoutS?: number | null | undefined;
  /** The options' key prefix for config errors, e.g. `servers.policy_model.options`. */
  configKey: string;
}

/** An OpenAI-style base URL may end with `/v1`; the root is what the `/ng-rollout` prefix goes after. */
export function backendRootOf(url: string): string {
  return url.replace(/\/+$/, '').replace(/\/v1$/, '');
}

/** Reads the key from the environment once, at startup: a named but unset variable fails the start. */
export function resolveBackend(c: BackendConfig, env: NodeJS.ProcessEnv = process.env): Backend {
  let key: string | undefined;
  if (c.apiKeyEnv !== undefined) {
    key = env[c.apiKeyEnv];
    if (!key) throw new ConfigError(`${c.configKey}.api_key_env`, `the environment variable ${c.apiKeyEnv} is not set (it must hold the backend's API key)`);
  }
  const header = key === undefined ? undefined : `Bearer ${key}`;
  const timeoutS = c.requestTimeoutS === undefined ? (c.api === 'openai' ? DEFAULT_OPENAI_TIMEOUT_S : null) : c.requestTimeoutS;
  return {
    api: c.api,
    root: backendRootOf(c.url),
    servedModel: c.servedModel,
    extraBody: c.extraBody ?? {},
    timeoutMs: timeoutS === null ? undefined : timeoutS * 1000,
    canCut: c.api === 'ng',
    authorization: () => header,
  };
}

/** A hosted API that stops answering should not hold an episode for ever. */
export const DEFAULT_OPENAI_TIMEOUT_S = 600;

/** Body fields only our own servers read (`ng_capture`, …). */
const EXTENSION_FIELD = /^ng_/;

/** The body the backend receives. */
export function backendBody(b: Backend, body: Record<string, unknown>): Record<string, unknown> {
  if (b.api === 'ng') return body;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(body)) if (!EXTENSION_FIELD.test(k)) out[k] = v;
  if (Array.isArray(out.messages)) out.messages = out.messages.map(withTextContent);
  Object.assign(out, b.extraBody);
  if (b.servedModel !== undefined) out.model = b.servedModel;
  return out;
}

/**
 * OpenAI lets an assistant turn that only calls tools have `content: null`; some servers' schemas
 * (llama-cpp-python's) demand a string and answer 500. The empty text means the same to all.
 */
function withTextContent(m: unknown): unknown {
  if (typeof m !== 'object' || m === null) return m;
  const msg = m as { role?: unknown; content?: unknown };
  return msg.role === 'assistant' && (msg.content === null || msg.content === undefined) ? { ...msg, content: '' } : m;
}

/** The backend URL of a routed path (`/v1/chat/completions`), under the caller's prefix for ours. */
export function backendUrl(b: Backend, path: string, key: CaptureKey | undefined): string {
  return joinPath(b.root, b.api === 'ng' && key !== undefined ? rolloutPath(key, path) : path);
}

export interface Upstream {
  status: number;
  headers: IncomingHttpHeaders;
  body: AsyncIterable<Uint8Array> & NodeJS.ReadableStream;
}

/**
 * Third-party servers (uvicorn, gunicorn, most proxies) drop an idle connection after ~5 s without
 * saying so in a Keep-Alive header, and a call sent on it as it closes fails ("other side closed").
 * Their own pool keeps idle sockets for less than that.
 */
let thirdPartyPool: Agent | undefined;

function poolOf(b: Backend): Dispatcher {
  if (b.api === 'ng') return dataAgent();
  thirdPartyPool ??= new Agent({ headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 2_000, keepAliveMaxTimeout: 2_000 });
  return thirdPartyPool;
}

export async function closeThirdPartyPool(): Promise<void> {
  const p = thirdPartyPool;
  thirdPartyPool = undefined;
  await p?.close();
}

/** Sends one call; a failure to get an answer throws a typed error (or the abort reason). */
export async function callBackend(
  b: Backend,
  init: { method: 'GET' | 'POST'; path: string; key: CaptureKey | undefined; body?: Record<string, unknown>; accept?: string; signal: AbortSignal },
): Promise<Upstream> {
  const url = backendUrl(b, init.path, init.key);
  const headers: Record<string, string> = {};
  if (init.body !== undefined) headers['content-type'] = 'application/json';
  if (init.accept !== undefined) headers.accept = init.accept;
  const auth = b.authorization();
  if (auth !== undefined) headers.authorization = auth;
  try {
    const res = await request(url, {
      method: init.method,
      headers,
      body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
      signal: init.signal,
      dispatcher: poolOf(b),
      ...(b.timeoutMs !== undefined ? { headersTimeout: b.timeoutMs, bodyTimeout: b.timeoutMs } : {}),
    });
    return { status: res.statusCode, headers: res.headers, body: res.body };
  } catch (err) {
    if (init.signal.aborted) throw init.signal.reason;
    throw transportFailure(url, err);
  }
}

/** No answer: the typed, retryable error. Never includes request headers. */
export function transportFailure(url: string, err: unknown): ProtocolError {
  const what = `${safeUrl(url)}: ${(err as Error)?.message ?? String(err)}`;
  if (isTimeout(err)) return refuse('backend_timeout', `the backend did not answer in time: ${what}`);
  return refuse('backend_unavailable', `the backend did not answer: ${what}`);
}

function isTimeout(err: unknown): boolean {
  return err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.BodyTimeoutError || (err as { name?: string })?.name === 'TimeoutError';
}

/** A URL's credentials (`https://user:pass@host`) never reach an error message. */
function safeUrl(url: string): string {
  try {
    const u = new URL(url);
    u.username = '';
    u.password = '';
    return u.toString();
  } catch {
    return '(backend)';
  }
}

/**
 * A third-party backend's non-2xx answer as our typed error: a 4xx is the caller's error (same
 * status, code `backend_rejected`), anything else is `backend_unavailable`. The backend's own
 * message (OpenAI's `{"error": {"message"}}`, or its text) is kept in the detail.
 */
export function mapBackendError(status: number, body: Buffer): ProtocolError {
  const text = body.toString('utf8');
  let message = text.slice(0, 500);
  try {
    const parsed = JSON.parse(text) as { error?: unknown; detail?: unknown; message?: unknown };
    const e = parsed.error;
    const m = typeof e === 'string' ? e : e && typeof e === 'object' ? (e as { message?: unknown }).message : (parsed.detail ?? parsed.message);
    if (typeof m === 'string') message = m.slice(0, 500);
    else if (m !== undefined) message = JSON.stringify(m).slice(0, 500);
  } catch {
    /* not JSON: its text */
  }
  if (status >= 400 && status < 500) return new ProtocolError('backend_rejected', `the backend answered HTTP ${status}: ${message}`, status);
  return refuse('backend_unavailable', `the backend answered HTTP ${status}: ${message}`);
}
