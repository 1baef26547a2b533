// Bodies of the agent's data-plane routes (participants.md §3.2) and the Responses-style items
// the agent keeps and returns (docs/gym-servers.md). Validated at the edge; handlers get typed data.
import { z } from 'zod';
import { EpisodeIdSchema, type EpisodeId } from '../../protocol/ids.js';
import { TaskIdSchema } from '../../protocol/tasks.js';

const CookieMapSchema = z.record(z.string(), z.string());

/** The one grant Simple Agent can use: tools served over HTTP by a resources server. */
export const DirectHttpGrantSchema = z.strictObject({
  kind: z.literal('direct_http'),
  name: z.string().min(1),
  required: z.boolean().default(true),
  /** With checkpointing on it ends with `/ng-rollout/<seeding capture key>`. */
  base_url: z.url({ protocol: /^https?$/ }),
  cookies: CookieMapSchema.default({}),
  headers: z.record(z.string(), z.string()).default({}),
});
export type DirectHttpGrant = z.infer<typeof DirectHttpGrantSchema>;

/** Any other grant kind (MCP, …): accepted only when not required, and never used. */
const OtherGrantSchema = z.looseObject({
  kind: z
    .string()
    .min(1)
    .refine((k) => k !== 'direct_http'),
  name: z.string().min(1),
  required: z.boolean().default(false),
});

export const ToolAccessSchema = z.union([DirectHttpGrantSchema, OtherGrantSchema]);
export type ToolAccess = z.infer<typeof ToolAccessSchema>;

export const SeedRequestSchema = z.strictObject({
  agent_session_id: z.string().min(1),
  episode_id: EpisodeIdSchema.nullable().optional(),
  task_id: TaskIdSchema.nullable().optional(),
  tool_accesses: z.array(ToolAccessSchema).default([]),
  sandbox_access: z.null().default(null),
});
export type SeedRequest = z.infer<typeof SeedRequestSchema>;

export const CloseRequestSchema = z.strictObject({
  agent_session_id: z.string().min(1),
  episode_id: EpisodeIdSchema.nullable().optional(),
});
export type CloseRequest = z.infer<typeof CloseRequestSchema>;

/** `responses_create_params`: open, the agent reads `input`, `tools` and a few sampling knobs. */
export const ActivationBodySchema = z.looseObject({
  input: z.union([z.string(), z.array(z.unknown())]),
  tools: z.array(z.unknown()).nullable().optional(),
  temperature: z.number().nullable().optional(),
  top_p: z.number().nullable().optional(),
  max_output_tokens: z.number().int().positive().nullable().optional(),
  /** Responses-style: `auto` (what the agent sends when absent and there are tools), `none`, `required`, or `{type: "function", name}`. */
  tool_choice: z
    .union([z.enum(['auto', 'none', 'required']), z.looseObject({ type: z.literal('function'), name: z.string().min(1) })])
    .nullable()
    .optional(),
});
export type ActivationBody = z.infer<typeof ActivationBodySchema>;

// --- Responses-style output items --------------------------------------------------------

export interface FunctionCallItem {
  type: 'function_call';
  call_id: string;
  name: string;
  arguments: string;
  [extra: string]: unknown;
}

export interface FunctionCallOutputItem {
  type: 'function_call_output';
  call_id: string;
  output: string;
}

export interface MessageItem {
  type: 'message';
  role: 'assistant';
  content: Array<{ type: 'output_text'; text: string }>;
  [extra: string]: unknown;
}

/** Items may also come from a foreign writer (reasoning, …): kept, passed through. */
export type OutputItem = FunctionCallItem | FunctionCallOutputItem | MessageItem | { type: string; [k: string]: unknown };

export const OutputItemSchema = z.looseObject({ type: z.string().min(1) });

export interface ResponsesUsage {
  input_tokens: number;
  output_tokens: number;
  total_tokens: number;
}

export const ResponsesUsageSchema = z.looseObject({
  input_tokens: z.number(),
  output_tokens: z.number(),
  total_tokens: z.number(),
});

export interface Observations {
  source: 'simple_agent';
  records: unknown[];
  gaps: unknown[];
}

export interface CloseReply {
  agent_session_id: string;
  agent_observations: Observations;
  resources_cookies: Record<string, string> | null;
}

/** The kept reply of an activation (§3.4 step 5). */
export interface CompletedReply {
  response: Record<string, unknown>;
  cookies: Record<string, string>;
}

export function episodeOrNull(e: EpisodeId | null | undefined): EpisodeId | null {
  return e ?? null;
}
