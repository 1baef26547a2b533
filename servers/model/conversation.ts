// What the capture ledger reads from a chat request (participants.md §5.4–5.6): digests of the
// request context, fingerprints of the model-authored turns (for parent resolution), the request
// digest a restored generation cut is matched by, and the constrained-decoding exclusion.
// Pure functions. Messages are normalized first (role, text, tool calls by name and arguments,
// tool_call_id) so that the agent rebuilding an assistant turn from its reply (content `null`
// vs `""`, extra fields) does not change a fingerprint.
import { createHash } from 'node:crypto';
import { contentText, type ChatMessage } from '../../protocol/openai.js';
import { canonicalJson } from '../../protocol/canonical-json.js';

export const FINGERPRINT_VERSION = 1;

export interface NormalizedMessage {
  role: string;
  text: string;
  tool_calls?: Array<{ name: string; arguments: string }>;
  tool_call_id?: string;
}

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function normalizeMessage(raw: unknown): NormalizedMessage {
  const m = (isObject(raw) ? raw : {}) as Partial<ChatMessage>;
  const out: NormalizedMessage = { role: typeof m.role === 'string' ? m.role : '', text: safeText(m.content) };
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
  if (calls.length) {
    out.tool_calls = calls.map((c) => {
      const fn: Record<string, unknown> = isObject(c) && isObject(c.function) ? c.function : {};
      return {
        name: typeof fn.name === 'string' ? fn.name : '',
        arguments: typeof fn.arguments === 'string' ? fn.arguments : canonicalJson(fn.arguments ?? null),
      };
    });
  }
  if (typeof m.tool_call_id === 'string') out.tool_call_id = m.tool_call_id;
  return out;
}

function safeText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return contentText(content as ChatMessage['content']);
  return '';
}

export function normalizeMessages(messages: readonly unknown[]): NormalizedMessage[] {
  return messages.map(normalizeMessage);
}

/** Digest of a (prefix of a) conversation. */
export function contextDigest(messages: readonly NormalizedMessage[]): string {
  return sha256Hex(canonicalJson(messages));
}

const isModelTurn = (m: NormalizedMessage): boolean => m.role === 'assistant';

/** One model-authored turn: what the model produced, without the conversation around it. */
export function turnFingerprint(m: NormalizedMessage): string {
  return sha256Hex(canonicalJson({ text: m.text, tool_calls: m.tool_calls ?? [] }));
}

/** Fingerprint of the model-authored turns of a conversation, in order. */
export function modelTurnsFingerprint(messages: readonly NormalizedMessage[]): string {
  return sha256Hex(canonicalJson(messages.filter(isModelTurn).map(turnFingerprint)));
}

/** The fields a ledger row records about its request (known at admission). */
export interface RequestContext {
  /** Normalized request messages. */
  messages: NormalizedMessage[];
  /** Fingerprint of the model-authored turns in the request. */
  fingerprint: string;
  context_len: number;
  context_digest: string;
  /** Conversation digest of the request items (messages and tools): a restored cut matches it. */
  request_digest: string;
}

export function requestContext(body: Record<string, unknown>): RequestContext {
  const messages = normalizeMessages(Array.isArray(body.messages) ? body.messages : []);
  return {
    messages,
    fingerprint: modelTurnsFingerprint(messages),
    context_len: messages.length,
    context_digest: contextDigest(messages),
    request_digest: requestDigest(messages, body.tools),
  };
}

export function requestDigest(messages: readonly NormalizedMessage[], tools: unknown): string {
  return sha256Hex(canonicalJson({ messages, tools: Array.isArray(tools) ? tools : [] }));
}

/** What parent resolution needs of a row (participants.md §5.4). */
export interface LineageRow {
  model_call_id: string;
  fingerprint?: unknown;
  context_len?: unknown;
  context_digest?: unknown;
  output_fingerprint?: unknown;
}

/**
 * The parent of a call: the latest row whose request context is a prefix of this request and is
 * followed in it by exactly one more model turn — the row's own output (checked against
 * `output_fingerprint` when the row has one). A first call (no model turns) has no parent.
 */
export function resolveParent(rows: readonly LineageRow[], ctx: RequestContext): string | null {
  const turns = ctx.messages.filter(isModelTurn);
  if (turns.length === 0) return null;
  const last = turns[turns.length - 1]!;
  // The model turns before the last one are what the parent's own request held.
  const priorFingerprint = sha256Hex(canonicalJson(turns.slice(0, -1).map(turnFingerprint)));
  const lastFingerprint = turnFingerprint(last);
  const prefixDigests = new Map<number, string>();
  for (let i = rows.length - 1; i >= 0; i--) {
    const row = rows[i]!;
    if (row.fingerprint !== priorFingerprint) continue;
    const len = row.context_len;
    if (typeof len !== 'number' || !Number.isInteger(len) || len < 0 || len >= ctx.messages.length) continue;
    const next = ctx.messages[len]!;
    if (!isModelTurn(next)) continue;
    if (typeof row.output_fingerprint === 'string' && row.output_fingerprint !== turnFingerprint(next)) continue;
    if (turnFingerprint(next) !== lastFingerprint) continue;
    let digest = prefixDigests.get(len);
    if (digest === undefined) {
      digest = contextDigest(ctx.messages.slice(0, len));
      prefixDigests.set(len, digest);
    }
    if (digest === row.context_digest) return row.model_call_id;
  }
  return null;
}

// --- constrained decoding (§5.5) ------------------------------------------------------------

const GUIDED_FIELDS = [
  'guided_choice',
  'guided_grammar',
  'guided_json',
  'guided_regex',
  'guided_whitespace_pattern',
  'structural_tag',
  'structured_outputs',
] as const;

/** Why a request is constrained decoding (never cut, never continues a cut), or undefined. */
export function constrainedDecoding(body: Record<string, unknown>): string | undefined {
  const tc = body.tool_choice;
  if (tc !== undefined && tc !== null && tc !== 'auto' && tc !== 'none') return 'tool_choice';
  const rf = body.response_format;
  if (rf !== undefined && rf !== null && !(isObject(rf) && rf.type === 'text')) return 'response_format';
  for (const f of GUIDED_FIELDS) {
    if (body[f] !== undefined && body[f] !== null) return f;
  }
  return undefined;
}
