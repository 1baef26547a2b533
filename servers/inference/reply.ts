// OpenAI-shaped replies for a policy decision, with vLLM-style fake tokens: one token per
// character (`ord(ch) % 250 + 1`, as Gym's fake backend does). The completion's tokens are the
// answer text, or the tool call's argument text. The action's logprob sits on the first token,
// 0 on the rest, so the sequence logprob equals the action's.
import { contentText, type ChatCompletion, type ChatCompletionChunk, type ChatMessage, type TokenLogprob, type Usage } from '../../protocol/openai.js';
import type { PolicyDecision } from './policy.js';

export const MODEL_ID = 'tiny-policy';

export function fakeTokenId(ch: string): number {
  return (ch.codePointAt(0)! % 250) + 1;
}

export function fakeTokenIds(text: string): number[] {
  return Array.from(text, fakeTokenId);
}

/** The text the prompt's fake tokens are taken from: each message's role, content and tool calls. */
export function promptTextOf(messages: readonly ChatMessage[]): string {
  return messages
    .map((m) => {
      const calls = (m.tool_calls ?? []).map((c) => `${c.function.name}(${c.function.arguments})`).join('');
      return `${m.role}: ${contentText(m.content)}${calls}`;
    })
    .join('\n');
}

/** The generated tokens (one per character) of a decision. */
export function completionTokens(d: PolicyDecision): string[] {
  const call = d.message.tool_calls?.[0];
  return Array.from(call ? call.function.arguments : contentText(d.message.content));
}

export interface ReplyMeta {
  id: string;
  created: number;
  model: string;
  promptTokenIds: number[];
}

function logprobEntry(d: PolicyDecision, token: string, i: number): TokenLogprob {
  return { token, logprob: i === 0 ? d.logprob : 0, bytes: [...Buffer.from(token, 'utf8')], top_logprobs: [] };
}

function usageOf(meta: ReplyMeta, completionCount: number): Usage {
  return { prompt_tokens: meta.promptTokenIds.length, completion_tokens: completionCount, total_tokens: meta.promptTokenIds.length + completionCount };
}

function ngPolicy(d: PolicyDecision): { situation: string; action: string; logprob: number; version: number } {
  return { situation: d.situation, action: d.action, logprob: d.logprob, version: d.version };
}

export function completionBody(d: PolicyDecision, meta: ReplyMeta): ChatCompletion {
  const tokens = completionTokens(d);
  return {
    id: meta.id,
    object: 'chat.completion',
    created: meta.created,
    model: meta.model,
    choices: [
      {
        index: 0,
        message: d.message,
        finish_reason: d.finishReason,
        logprobs: { content: tokens.map((t, i) => logprobEntry(d, t, i)) },
        token_ids: tokens.map(fakeTokenId),
      },
    ],
    usage: usageOf(meta, tokens.length),
    prompt_token_ids: meta.promptTokenIds,
    ng_policy: ngPolicy(d),
  };
}

/** The stream chunk carrying token `i`; the first also opens the message (role, tool call id/name). */
export function tokenChunk(d: PolicyDecision, meta: ReplyMeta, i: number, token: string): ChatCompletionChunk {
  const call = d.message.tool_calls?.[0];
  const delta: ChatCompletionChunk['choices'][number]['delta'] = i === 0 ? { role: 'assistant' } : {};
  if (call) {
    delta.tool_calls = [
      i === 0
        ? { index: 0, id: call.id, type: 'function', function: { name: call.function.name, arguments: token } }
        : { index: 0, function: { arguments: token } },
    ];
  } else {
    delta.content = token;
  }
  return {
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    choices: [{ index: 0, delta, finish_reason: null, logprobs: { content: [logprobEntry(d, token, i)] }, token_ids: [fakeTokenId(token)] }],
    ...(i === 0 ? { prompt_token_ids: meta.promptTokenIds, ng_policy: ngPolicy(d) } : {}),
  };
}

/** The closing chunk: finish reason, usage and the policy decision. */
export function finalChunk(d: PolicyDecision, meta: ReplyMeta, completionCount: number): ChatCompletionChunk {
  return {
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    choices: [{ index: 0, delta: {}, finish_reason: d.finishReason, logprobs: null }],
    usage: usageOf(meta, completionCount),
    ng_policy: ngPolicy(d),
  };
}
