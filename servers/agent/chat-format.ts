// Responses-style ↔ chat completions (docs/gym-servers.md): the agent keeps Responses-style items
// and speaks chat completions to the policy model server. Pure functions.
import { refuse } from '../../protocol/errors.js';
import {
  ChatCompletionSchema,
  ResponsesFunctionToolSchema,
  chatToolFromResponses,
  contentText,
  type ChatCompletion,
  type ChatMessage,
  type ChatTool,
  type ChatToolCall,
} from '../../protocol/openai.js';
import type { FunctionCallItem, MessageItem, OutputItem, ResponsesUsage } from './wire.js';

type Item = Record<string, unknown>;

function isObject(v: unknown): v is Item {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Responses message content: a string or parts (`input_text`, `output_text`, `text`, …). */
function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((p) => (isObject(p) && typeof p.text === 'string' ? p.text : '')).join('');
  }
  return '';
}

function outputText(output: unknown): string {
  if (typeof output === 'string') return output;
  if (Array.isArray(output)) return textOf(output);
  return JSON.stringify(output ?? null);
}

/**
 * The chat messages for one model call: the request's input followed by the outputs so far.
 * A model turn (text and/or function calls) becomes one assistant message, so the number of
 * assistant messages is the number of earlier model calls (the tiny policy's call index).
 */
export function toChatMessages(input: string | readonly unknown[], outputs: readonly OutputItem[]): ChatMessage[] {
  const items: unknown[] = typeof input === 'string' ? [{ role: 'user', content: input }] : [...input];
  items.push(...outputs);
  const messages: ChatMessage[] = [];
  // The assistant message function calls attach to: the last message, if it is an assistant one.
  let open: ChatMessage | undefined;
  for (const [i, raw] of items.entries()) {
    if (!isObject(raw)) throw refuse('invalid_request', `input item ${i} is not an object`);
    const type = typeof raw.type === 'string' ? raw.type : 'message';
    if (type === 'function_call') {
      const call: ChatToolCall = {
        id: String(raw.call_id ?? `call_${i}`),
        type: 'function',
        function: { name: String(raw.name ?? ''), arguments: typeof raw.arguments === 'string' ? raw.arguments : JSON.stringify(raw.arguments ?? {}) },
      };
      if (open) (open.tool_calls ??= []).push(call);
      else {
        open = { role: 'assistant', content: null, tool_calls: [call] };
        messages.push(open);
      }
    } else if (type === 'function_call_output') {
      messages.push({ role: 'tool', tool_call_id: String(raw.call_id ?? ''), content: outputText(raw.output) });
      open = undefined;
    } else if (type === 'message') {
      const role = typeof raw.role === 'string' ? raw.role : 'user';
      // Chat backends (vLLM templates) know `system`; Responses' `developer` plays that role.
      const msg: ChatMessage = { role: role === 'developer' ? 'system' : role, content: textOf(raw.content) };
      messages.push(msg);
      open = role === 'assistant' ? msg : undefined;
    }
    // Other item types (reasoning, …) carry nothing a chat backend reads.
  }
  return messages;
}

/** Responses-style function tools → chat-completion tools; other tool types are dropped. */
export function toChatTools(tools: readonly unknown[] | null | undefined): ChatTool[] {
  const out: ChatTool[] = [];
  for (const [i, t] of (tools ?? []).entries()) {
    if (isObject(t) && t.type !== 'function') continue;
    const parsed = ResponsesFunctionToolSchema.safeParse(t);
    if (!parsed.success) throw refuse('invalid_request', `tools[${i}] is not a function tool: ${parsed.error.issues[0]?.message ?? 'invalid'}`);
    out.push(chatToolFromResponses(parsed.data));
  }
  return out;
}

/** One model call as the loop sees it. */
export interface ModelTurn {
  items: OutputItem[];
  usage: ResponsesUsage | null;
  /** Set when the turn cannot be continued (`length`, `content_filter`, an empty answer). */
  incomplete: { reason: string } | null;
  /** The call's reply in Responses form (`last_model_response`). */
  response: Record<string, unknown>;
  /** What observations keep of the call. */
  record: Record<string, unknown>;
}

/**
 * Tool calls as real models write them: arguments as an object instead of JSON text, no `id`, no
 * `type`. Normalized before the schema so such a turn is a turn, not a failed call; arguments that
 * are not valid JSON stay as they are and reach the tool as an error output (peers.ts).
 */
function withToolCallsNormalized(raw: unknown, step: number): unknown {
  if (!isObject(raw) || !Array.isArray(raw.choices)) return raw;
  const choices = raw.choices.map((c) => {
    if (!isObject(c) || !isObject(c.message) || !Array.isArray(c.message.tool_calls)) return c;
    const calls = c.message.tool_calls.map((t, i) => {
      if (!isObject(t)) return t;
      const fn = isObject(t.function) ? t.function : {};
      const args = typeof fn.arguments === 'string' ? fn.arguments : JSON.stringify(fn.arguments ?? {});
      return {
        ...t,
        id: typeof t.id === 'string' && t.id ? t.id : `call_${step}_${i}`,
        type: 'function',
        function: { ...fn, name: typeof fn.name === 'string' ? fn.name : '', arguments: args },
      };
    });
    return { ...c, message: { ...c.message, tool_calls: calls } };
  });
  return { ...raw, choices };
}

/** Parses a chat completion (choice 0) into Responses-style items. */
export function fromChatCompletion(raw: unknown, step: number): ModelTurn {
  const parsed = ChatCompletionSchema.safeParse(withToolCallsNormalized(raw, step));
  if (!parsed.success) throw new Error(`model reply is not a chat completion: ${parsed.error.issues[0]?.message ?? 'invalid'}`);
  const reply: ChatCompletion = parsed.data;
  const choice = reply.choices.find((c) => c.index === 0) ?? reply.choices[0]!;
  const text = contentText(choice.message.content);
  const items: OutputItem[] = [];
  if (text.length > 0) {
    const msg: MessageItem = { type: 'message', role: 'assistant', content: [{ type: 'output_text', text }] };
    items.push(msg);
  }
  for (const [i, call] of (choice.message.tool_calls ?? []).entries()) {
    const fc: FunctionCallItem = {
      type: 'function_call',
      call_id: call.id || `call_${step}_${i}`,
      name: call.function.name,
      arguments: call.function.arguments,
    };
    items.push(fc);
  }
  // The policy's decision rides on the turn's first item so a trainer finds it in the response.
  if (reply.ng_policy && items[0]) items[0] = { ...items[0], ng_policy: reply.ng_policy };
  const usage: ResponsesUsage | null = reply.usage
    ? { input_tokens: reply.usage.prompt_tokens, output_tokens: reply.usage.completion_tokens, total_tokens: reply.usage.total_tokens }
    : null;
  let incomplete: { reason: string } | null = null;
  if (choice.finish_reason === 'length') incomplete = { reason: 'max_output_tokens' };
  else if (choice.finish_reason === 'content_filter') incomplete = { reason: 'content_filter' };
  else if (items.length === 0) incomplete = { reason: 'empty_answer' };
  return {
    items,
    usage,
    incomplete,
    response: { id: reply.id, object: 'response', model: reply.model, output: items, usage, incomplete_details: incomplete },
    record: {
      step,
      response_id: reply.id,
      model: reply.model,
      finish_reason: choice.finish_reason,
      usage,
      ...(reply.ng_policy ? { ng_policy: reply.ng_policy } : {}),
    },
  };
}
