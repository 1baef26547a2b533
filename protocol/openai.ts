// The subset of OpenAI chat completions our servers speak (agent → model → inference), plus the
// Responses-style tool definitions tasks carry. Lenient on purpose: unknown fields are allowed
// and kept, so a real OpenAI-compatible backend (vLLM, llama.cpp) fits the same schemas.
import { z } from 'zod';

// --- requests ---------------------------------------------------------------------------

export const ChatToolCallSchema = z.looseObject({
  id: z.string(),
  type: z.literal('function').default('function'),
  function: z.looseObject({ name: z.string(), arguments: z.string() }),
});
export type ChatToolCall = z.infer<typeof ChatToolCallSchema>;

/** Text, null, or content parts (`{type: "text", text}`; other part types pass through). */
export const ChatContentSchema = z.union([z.string(), z.null(), z.array(z.looseObject({ type: z.string(), text: z.string().optional() }))]);

export const ChatMessageSchema = z.looseObject({
  role: z.string().min(1),
  content: ChatContentSchema.optional(),
  tool_calls: z.array(ChatToolCallSchema).optional(),
  tool_call_id: z.string().optional(),
  name: z.string().optional(),
});
export type ChatMessage = z.infer<typeof ChatMessageSchema>;

export const ChatToolSchema = z.looseObject({
  type: z.literal('function'),
  function: z.looseObject({
    name: z.string().min(1),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
  }),
});
export type ChatTool = z.infer<typeof ChatToolSchema>;

export const ChatCompletionRequestSchema = z.looseObject({
  model: z.string().optional(),
  messages: z.array(ChatMessageSchema).min(1),
  tools: z.array(ChatToolSchema).optional(),
  stream: z.boolean().optional(),
});
export type ChatCompletionRequest = z.infer<typeof ChatCompletionRequestSchema>;

// --- replies ----------------------------------------------------------------------------

export const UsageSchema = z.looseObject({
  prompt_tokens: z.number().int().min(0),
  completion_tokens: z.number().int().min(0),
  total_tokens: z.number().int().min(0),
});
export type Usage = z.infer<typeof UsageSchema>;

export const TokenLogprobSchema = z.looseObject({
  token: z.string(),
  logprob: z.number(),
  bytes: z.array(z.number().int()).nullable().optional(),
  top_logprobs: z.array(z.unknown()).optional(),
});
export type TokenLogprob = z.infer<typeof TokenLogprobSchema>;

export const ChoiceLogprobsSchema = z.looseObject({ content: z.array(TokenLogprobSchema).nullable() });

/** What the tiny policy decided for a call (our extension; a real backend omits it). */
export const NgPolicySchema = z.looseObject({
  situation: z.string(),
  action: z.string(),
  logprob: z.number(),
  version: z.number(),
});
export type NgPolicy = z.infer<typeof NgPolicySchema>;

export const FINISH_REASONS = ['stop', 'tool_calls', 'length', 'content_filter'] as const;

export const ChatChoiceSchema = z.looseObject({
  index: z.number().int().min(0),
  message: ChatMessageSchema,
  finish_reason: z.string().nullable(),
  logprobs: ChoiceLogprobsSchema.nullable().optional(),
  /** vLLM-style generated token IDs. */
  token_ids: z.array(z.number().int()).optional(),
});

export const ChatCompletionSchema = z.looseObject({
  id: z.string(),
  object: z.literal('chat.completion'),
  created: z.number(),
  model: z.string(),
  choices: z.array(ChatChoiceSchema).min(1),
  usage: UsageSchema.optional(),
  /** vLLM-style prompt token IDs. */
  prompt_token_ids: z.array(z.number().int()).nullable().optional(),
  ng_policy: NgPolicySchema.optional(),
});
export type ChatCompletion = z.infer<typeof ChatCompletionSchema>;

export const ToolCallDeltaSchema = z.looseObject({
  index: z.number().int().min(0),
  id: z.string().optional(),
  type: z.literal('function').optional(),
  function: z.looseObject({ name: z.string().optional(), arguments: z.string().optional() }).optional(),
});

export const ChatChunkChoiceSchema = z.looseObject({
  index: z.number().int().min(0),
  delta: z.looseObject({
    role: z.string().optional(),
    content: z.string().nullable().optional(),
    tool_calls: z.array(ToolCallDeltaSchema).optional(),
  }),
  finish_reason: z.string().nullable().optional(),
  logprobs: ChoiceLogprobsSchema.nullable().optional(),
  token_ids: z.array(z.number().int()).optional(),
});

export const ChatCompletionChunkSchema = z.looseObject({
  id: z.string(),
  object: z.literal('chat.completion.chunk'),
  created: z.number(),
  model: z.string(),
  choices: z.array(ChatChunkChoiceSchema),
  usage: UsageSchema.nullable().optional(),
  prompt_token_ids: z.array(z.number().int()).nullable().optional(),
  ng_policy: NgPolicySchema.optional(),
});
export type ChatCompletionChunk = z.infer<typeof ChatCompletionChunkSchema>;

/**
 * Folds a streamed reply (choice 0) into the non-streamed shape: content and tool-call argument
 * deltas concatenated, logprobs and token IDs appended, the last finish reason and usage kept.
 */
export function completionFromChunks(chunks: readonly ChatCompletionChunk[]): ChatCompletion {
  const first = chunks[0];
  if (!first) throw new Error('completionFromChunks: no chunks');
  let content: string | null = null;
  const calls: { id: string; type: 'function'; function: { name: string; arguments: string } }[] = [];
  const logprobs: TokenLogprob[] = [];
  const tokenIds: number[] = [];
  let finish: string | null = null;
  let usage: Usage | undefined;
  let promptIds: number[] | null | undefined;
  let policy: NgPolicy | undefined;
  let sawLogprobs = false;
  for (const ch of chunks) {
    if (ch.usage) usage = ch.usage;
    if (ch.prompt_token_ids) promptIds = ch.prompt_token_ids;
    if (ch.ng_policy) policy = ch.ng_policy;
    const c = ch.choices.find((x) => x.index === 0);
    if (!c) continue;
    if (typeof c.delta.content === 'string') content = (content ?? '') + c.delta.content;
    for (const d of c.delta.tool_calls ?? []) {
      const call = (calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
      if (d.id) call.id = d.id;
      if (d.function?.name) call.function.name += d.function.name;
      if (d.function?.arguments) call.function.arguments += d.function.arguments;
    }
    if (c.logprobs?.content) {
      sawLogprobs = true;
      logprobs.push(...c.logprobs.content);
    }
    if (c.token_ids) tokenIds.push(...c.token_ids);
    if (c.finish_reason) finish = c.finish_reason;
  }
  const message: ChatMessage = { role: 'assistant', content };
  if (calls.length) message.tool_calls = calls.filter(Boolean);
  return {
    id: first.id,
    object: 'chat.completion',
    created: first.created,
    model: first.model,
    choices: [
      {
        index: 0,
        message,
        finish_reason: finish,
        logprobs: sawLogprobs ? { content: logprobs } : null,
        ...(tokenIds.length ? { token_ids: tokenIds } : {}),
      },
    ],
    ...(usage ? { usage } : {}),
    ...(promptIds !== undefined ? { prompt_token_ids: promptIds } : {}),
    ...(policy ? { ng_policy: policy } : {}),
  };
}

// --- Responses-style tools (task definitions) -------------------------------------------

/** `{"type": "function", "name", "description", "parameters"}` as tasks carry them. */
export const ResponsesFunctionToolSchema = z.looseObject({
  type: z.literal('function'),
  name: z.string().min(1),
  description: z.string().nullable().optional(),
  parameters: z.record(z.string(), z.unknown()).nullable().optional(),
  strict: z.boolean().nullable().optional(),
});
export type ResponsesFunctionTool = z.infer<typeof ResponsesFunctionToolSchema>;

/** The chat-completion form of a Responses-style function tool (what the agent sends the model). */
export function chatToolFromResponses(t: ResponsesFunctionTool): ChatTool {
  return {
    type: 'function',
    function: {
      name: t.name,
      ...(t.description != null ? { description: t.description } : {}),
      ...(t.parameters != null ? { parameters: t.parameters } : {}),
    },
  };
}

/** The text of a message's content (parts joined); '' for null or missing. */
export function contentText(content: ChatMessage['content']): string {
  if (typeof content === 'string') return content;
  if (!content) return '';
  return content.map((p) => (typeof p.text === 'string' ? p.text : '')).join('');
}
