// The agent's outbound calls: chat completions on the policy model server (under the
// activation's `/ng-rollout/<key>` prefix) and tool calls on the grant's resources server.
import { ERROR_STATUS, ProtocolError, errorCodeOf, type ErrorCode } from '../../protocol/errors.js';
import type { CaptureKey } from '../../protocol/ids.js';
import type { ChatMessage, ChatTool } from '../../protocol/openai.js';
import { callJson } from '../common/http-client.js';
import { fromChatCompletion, type ModelTurn } from './chat-format.js';
import type { ToolOutcome } from './turn-loop.js';
import type { ActivationBody, DirectHttpGrant, FunctionCallItem } from './wire.js';

/** The `model` field of every chat call: the policy model server serves one policy. */
export const POLICY_MODEL_NAME = 'policy';

/** A peer failed (connection, 5xx, bad reply): the activation fails with a retryable 502. */
export class UpstreamError extends Error {
  constructor(
    readonly code: 'model_error' | 'tool_error',
    message: string,
  ) {
    super(message);
    this.name = 'UpstreamError';
  }
}

// Refusals a peer raises about the episode itself are the episode's refusals here too: a retired
// attempt stays retired, whichever server noticed first.
const PASSED_ON: readonly ErrorCode[] = ['stale_attempt', 'admission_closed', 'rollout_id_required', 'invalid_rollout_id'];

function passOn(status: number, body: unknown): ProtocolError | undefined {
  const code = errorCodeOf(body) as ErrorCode | undefined;
  if (!code || !PASSED_ON.includes(code) || ERROR_STATUS[code] !== status) return undefined;
  const detail = (body as { error: { detail?: unknown } }).error.detail;
  return new ProtocolError(code, typeof detail === 'string' ? detail : code);
}

function abortReason(signal: AbortSignal, err: unknown): unknown {
  return signal.aborted ? signal.reason : err;
}

export interface ModelCall {
  modelUrl: string;
  rollout: CaptureKey | undefined;
  messages: ChatMessage[];
  tools: ChatTool[];
  params: ActivationBody;
  cookies: Record<string, string>;
  step: number;
  signal: AbortSignal;
}

export function chatBody(call: Pick<ModelCall, 'messages' | 'tools' | 'params'>): Record<string, unknown> {
  const body: Record<string, unknown> = { model: POLICY_MODEL_NAME, messages: call.messages };
  if (call.tools.length) {
    body.tools = call.tools;
    // Said explicitly: some OpenAI-compatible servers (llama.cpp) offer no tool call without it.
    const choice = call.params.tool_choice ?? 'auto';
    body.tool_choice = typeof choice === 'string' ? choice : { type: 'function', function: { name: choice.name } };
  }
  if (call.params.temperature != null) body.temperature = call.params.temperature;
  if (call.params.top_p != null) body.top_p = call.params.top_p;
  if (call.params.max_output_tokens != null) body.max_tokens = call.params.max_output_tokens;
  return body;
}

export async function callModel(call: ModelCall): Promise<ModelTurn & { cookies: Record<string, string> }> {
  let reply;
  try {
    reply = await callJson(call.modelUrl, '/v1/chat/completions', chatBody(call), {
      rollout: call.rollout,
      cookies: call.cookies,
      signal: call.signal,
      held: true,
    });
  } catch (err) {
    if (call.signal.aborted) throw call.signal.reason;
    throw new UpstreamError('model_error', `model call failed: ${(err as Error).message}`);
  }
  if (reply.status < 200 || reply.status >= 300) {
    if (errorCodeOf(reply.body) === 'backend_rejected' && REJECTED_TURN_STATUSES.has(reply.status))
      return { ...rejectedTurn(reply.status, reply.body, call.step), cookies: reply.cookies };
    throw passOn(reply.status, reply.body) ?? new UpstreamError('model_error', `model server answered HTTP ${reply.status}: ${brief(reply.body)}`);
  }
  try {
    return { ...fromChatCompletion(reply.body, call.step), cookies: reply.cookies };
  } catch (err) {
    throw new UpstreamError('model_error', (err as Error).message);
  }
}

/**
 * The backend refused the request itself (a conversation longer than its context, arguments it
 * cannot take): the episode cannot go on, and ends with this outcome for the environment to score.
 * Other refusals (a wrong key, an unknown model) are the deployment's, and fail the activation.
 */
const REJECTED_TURN_STATUSES = new Set([400, 413, 422]);

function rejectedTurn(status: number, body: unknown, step: number): ModelTurn {
  const detail = (body as { error?: { detail?: unknown } }).error?.detail;
  const incomplete = { reason: 'model_rejected' };
  return {
    items: [],
    usage: null,
    incomplete,
    response: { id: `rejected_${step}`, object: 'response', output: [], usage: null, incomplete_details: incomplete },
    record: { step, status, error: typeof detail === 'string' ? detail : 'the backend rejected the call' },
  };
}

const ROLLOUT_SUFFIX = /\/ng-rollout\/[A-Za-z0-9][A-Za-z0-9._-]*\/?$/;

/**
 * The grant's base URL under the current activation's prefix (§3.3 step 4): the seed put the
 * seeding attempt's key there; a restored replacement must call as its own attempt, not as the
 * retired one. Same key → the URL unchanged (never a second prefix).
 */
export function toolBaseUrl(baseUrl: string, rollout: CaptureKey | undefined): string {
  if (rollout === undefined) return baseUrl;
  const m = ROLLOUT_SUFFIX.exec(baseUrl);
  const root = m ? baseUrl.slice(0, m.index) : baseUrl.replace(/\/+$/, '');
  return `${root}/ng-rollout/${rollout}`;
}

export interface ToolCall {
  grant: DirectHttpGrant | null;
  rollout: CaptureKey | undefined;
  call: FunctionCallItem;
  cookies: Record<string, string>;
  signal: AbortSignal;
}

/** Runs one function call. Tool HTTP errors and bad arguments become the output the model reads. */
export async function callTool(t: ToolCall): Promise<ToolOutcome> {
  const base = { call_id: t.call.call_id, name: t.call.name };
  let args: unknown;
  try {
    args = JSON.parse(t.call.arguments || '{}');
  } catch (err) {
    const error = `invalid JSON arguments for tool '${t.call.name}': ${(err as Error).message}`;
    return { output: `Error: ${error}`, cookies: {}, record: { ...base, status: null, error } };
  }
  if (!t.grant) {
    const error = `no tool access for tool '${t.call.name}'`;
    return { output: `Error: ${error}`, cookies: {}, record: { ...base, status: null, error } };
  }
  let reply;
  try {
    reply = await callJson(toolBaseUrl(t.grant.base_url, t.rollout), `/${encodeURIComponent(t.call.name)}`, args, {
      cookies: t.cookies,
      headers: t.grant.headers,
      signal: t.signal,
    });
  } catch (err) {
    throw abortReason(t.signal, new UpstreamError('tool_error', `tool '${t.call.name}' call failed: ${(err as Error).message}`));
  }
  if (reply.status < 200 || reply.status >= 300) {
    const refusal = passOn(reply.status, reply.body);
    if (refusal) throw refusal;
    const error = `HTTP ${reply.status}: ${brief(reply.body)}`;
    return { output: `Error: tool '${t.call.name}' failed with ${error}`, cookies: reply.cookies, record: { ...base, status: reply.status, error } };
  }
  const output = typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body);
  return { output, cookies: reply.cookies, record: { ...base, status: reply.status } };
}

function brief(body: unknown): string {
  return (typeof body === 'string' ? body : JSON.stringify(body)).slice(0, 500);
}
