// The tokens of a backend reply, for the token store: vLLM-style `prompt_token_ids` and
// `choices[0].token_ids` (or, with vLLM's `return_tokens_as_token_ids`, logprob entries whose token
// is `token_id:<n>`), OpenAI `choices[0].logprobs.content[].logprob`, the policy version
// (`ng_policy.version`), and the assistant message itself (what a text-only capture holds). A plain
// reply is read whole; a streamed one event by event as it is relayed (SseCollector), so the stream
// is never buffered. Pure; tolerant of replies without token data.
import type { CompletionMessage, ReplyTokens } from './gate.js';

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const intArray = (v: unknown): number[] | null => (Array.isArray(v) && v.every((x) => Number.isInteger(x)) ? (v as number[]) : null);

function logprobsOf(choice: Record<string, unknown>): number[] | null {
  const lp = choice.logprobs;
  if (!isObject(lp) || !Array.isArray(lp.content)) return null;
  const out: number[] = [];
  for (const e of lp.content) {
    if (!isObject(e) || typeof e.logprob !== 'number') return null;
    out.push(e.logprob);
  }
  return out;
}

const TOKEN_ID = /^token_id:(0|[1-9][0-9]*)$/;

/** Token IDs spelled in the logprob entries (`"token": "token_id:42"`), when every entry has one. */
function tokenIdsOfLogprobs(choice: Record<string, unknown>): number[] | null {
  const lp = choice.logprobs;
  if (!isObject(lp) || !Array.isArray(lp.content) || lp.content.length === 0) return null;
  const out: number[] = [];
  for (const e of lp.content) {
    const m = isObject(e) && typeof e.token === 'string' ? TOKEN_ID.exec(e.token) : null;
    if (!m) return null;
    out.push(Number(m[1]));
  }
  return out;
}

function messageOf(choice: Record<string, unknown>): CompletionMessage | null {
  const m = choice.message;
  if (!isObject(m)) return null;
  const content = typeof m.content === 'string' ? m.content : null;
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls.filter(isObject) : [];
  return { role: 'assistant', content, ...(calls.length ? { tool_calls: calls } : {}) };
}

/** The policy version of a reply or chunk (`ng_policy.version`), if it carries one. */
export function weightVersionOf(body: unknown): number | null {
  if (!isObject(body) || !isObject(body.ng_policy)) return null;
  const v = body.ng_policy.version;
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

export function responseIdOf(body: unknown): string | null {
  return isObject(body) && typeof body.id === 'string' ? body.id : null;
}

/** Tokens of a plain chat completion. */
export function tokensOfCompletion(body: unknown): ReplyTokens {
  const choice = isObject(body) && Array.isArray(body.choices) && isObject(body.choices[0]) ? body.choices[0] : {};
  return {
    responseId: responseIdOf(body),
    weightVersion: weightVersionOf(body),
    promptTokenIds: isObject(body) ? intArray(body.prompt_token_ids) : null,
    completionTokenIds: intArray(choice.token_ids) ?? tokenIdsOfLogprobs(choice),
    completionLogprobs: logprobsOf(choice),
    completionMessage: messageOf(choice),
    finishReason: typeof choice.finish_reason === 'string' ? choice.finish_reason : null,
    complete: true,
  };
}

/** Collects the tokens of an SSE chat stream as its bytes pass through. */
export class SseCollector {
  private buffer = '';
  private readonly decoder = new TextDecoder();
  private responseId: string | null = null;
  private weightVersion: number | null = null;
  private promptTokenIds: number[] | null = null;
  private tokenIds: number[] | null = null;
  private logprobs: number[] | null = null;
  /** Token IDs spelled in the logprob entries, while every entry so far had one. */
  private logprobIds: number[] | null = [];
  private content: string | null = null;
  private readonly toolCalls: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }> = [];
  private finishReason: string | null = null;
  private done = false;
  /** Set once a chunk's token data could not be read: the token lists are then unknown. */
  private broken = false;

  /** Feeds bytes; returns the events completed by them, parsed (`[DONE]` and non-JSON skipped). */
  push(chunk: Uint8Array): unknown[] {
    this.buffer += this.decoder.decode(chunk, { stream: true });
    const events: unknown[] = [];
    for (;;) {
      const m = /\r?\n\r?\n/.exec(this.buffer);
      if (!m) break;
      const raw = this.buffer.slice(0, m.index);
      this.buffer = this.buffer.slice(m.index + m[0].length);
      const data = raw
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data.length === 0) continue;
      if (data === '[DONE]') {
        this.done = true;
        continue;
      }
      let ev: unknown;
      try {
        ev = JSON.parse(data);
      } catch {
        continue;
      }
      events.push(ev);
      this.absorb(ev);
    }
    return events;
  }

  private absorb(ev: unknown): void {
    if (!isObject(ev)) return;
    this.responseId ??= responseIdOf(ev);
    this.weightVersion ??= weightVersionOf(ev);
    this.promptTokenIds ??= intArray(ev.prompt_token_ids);
    const choice = Array.isArray(ev.choices) ? ev.choices.find((c) => isObject(c) && (c.index ?? 0) === 0) : undefined;
    if (!isObject(choice)) return;
    if (typeof choice.finish_reason === 'string') this.finishReason = choice.finish_reason;
    if (choice.token_ids !== undefined) {
      const ids = intArray(choice.token_ids);
      if (ids === null) this.broken = true;
      else (this.tokenIds ??= []).push(...ids);
    }
    if (isObject(choice.logprobs)) {
      const lps = logprobsOf(choice);
      if (lps === null) this.broken = true;
      else (this.logprobs ??= []).push(...lps);
      const ids = Array.isArray(choice.logprobs.content) && choice.logprobs.content.length === 0 ? [] : tokenIdsOfLogprobs(choice);
      if (ids === null) this.logprobIds = null;
      else this.logprobIds?.push(...ids);
    }
    const delta = choice.delta;
    if (isObject(delta)) {
      if (typeof delta.content === 'string') this.content = (this.content ?? '') + delta.content;
      for (const d of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
        if (!isObject(d) || !Number.isInteger(d.index)) continue;
        const call = (this.toolCalls[d.index as number] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (typeof d.id === 'string') call.id = d.id;
        const f = isObject(d.function) ? d.function : {};
        if (typeof f.name === 'string') call.function.name += f.name;
        if (typeof f.arguments === 'string') call.function.arguments += f.arguments;
      }
    }
  }

  result(): ReplyTokens {
    const calls = this.toolCalls.filter(Boolean);
    const spelled = this.logprobIds !== null && this.logprobIds.length > 0 ? this.logprobIds : null;
    return {
      responseId: this.responseId,
      weightVersion: this.weightVersion,
      promptTokenIds: this.promptTokenIds,
      completionTokenIds: this.broken ? null : (this.tokenIds ?? spelled),
      completionLogprobs: this.broken ? null : this.logprobs,
      completionMessage: { role: 'assistant', content: this.content, ...(calls.length ? { tool_calls: calls } : {}) },
      finishReason: this.finishReason,
      complete: this.done || this.finishReason !== null,
    };
  }
}
