// The turn loop's state (`SimpleAgentLoopState`, participants.md §3.3): what a boundary pins and a
// checkpoint exports, and what a restored session continues from.
import { z } from 'zod';
import { OutputItemSchema, ResponsesUsageSchema, type FunctionCallItem, type OutputItem, type ResponsesUsage } from './wire.js';

export interface LoopState {
  /** Model calls made so far in this activation. */
  step: number;
  /** The last model response asked for tools that have not run yet. */
  pending_tools: boolean;
  new_outputs: OutputItem[];
  usage: ResponsesUsage | null;
  last_model_response: Record<string, unknown> | null;
  model_server_cookies: Record<string, string>;
  resources_server_cookies: Record<string, string>;
  turns: unknown[];
  tool_records: unknown[];
  model_calls: unknown[];
  gaps: unknown[];
}

const CookiesSchema = z.record(z.string(), z.string());

/** Extra keys forbidden (§3.3). */
export const LoopStateSchema = z.strictObject({
  step: z.number().int().min(0),
  pending_tools: z.boolean(),
  new_outputs: z.array(OutputItemSchema),
  usage: ResponsesUsageSchema.nullable(),
  last_model_response: z.record(z.string(), z.unknown()).nullable(),
  model_server_cookies: CookiesSchema,
  resources_server_cookies: CookiesSchema,
  turns: z.array(z.unknown()),
  tool_records: z.array(z.unknown()),
  model_calls: z.array(z.unknown()),
  gaps: z.array(z.unknown()),
});

export function freshLoopState(resourcesCookies: Record<string, string> | null): LoopState {
  return {
    step: 0,
    pending_tools: false,
    new_outputs: [],
    usage: null,
    last_model_response: null,
    model_server_cookies: {},
    resources_server_cookies: { ...(resourcesCookies ?? {}) },
    turns: [],
    tool_records: [],
    model_calls: [],
    gaps: [],
  };
}

/** Materializes a boundary; JSON is built only when a checkpoint exports it. */
export type BoundarySnapshot = () => LoopState;

/**
 * Pins a boundary cheaply: list lengths and scalars now, the JSON later. Valid because the loop
 * only appends to its lists and replaces (never mutates) its usage and cookie objects.
 */
export function pinBoundary(s: LoopState): BoundarySnapshot {
  const { step, pending_tools, usage, last_model_response, model_server_cookies, resources_server_cookies } = s;
  const lists = {
    new_outputs: [s.new_outputs, s.new_outputs.length],
    turns: [s.turns, s.turns.length],
    tool_records: [s.tool_records, s.tool_records.length],
    model_calls: [s.model_calls, s.model_calls.length],
    gaps: [s.gaps, s.gaps.length],
  } as const;
  return () => ({
    step,
    pending_tools,
    new_outputs: lists.new_outputs[0].slice(0, lists.new_outputs[1]),
    usage: usage ? { ...usage } : null,
    last_model_response,
    model_server_cookies: { ...model_server_cookies },
    resources_server_cookies: { ...resources_server_cookies },
    turns: lists.turns[0].slice(0, lists.turns[1]),
    tool_records: lists.tool_records[0].slice(0, lists.tool_records[1]),
    model_calls: lists.model_calls[0].slice(0, lists.model_calls[1]),
    gaps: lists.gaps[0].slice(0, lists.gaps[1]),
  });
}

/** A deep copy the loop may append to without touching the stored (restored) boundary. */
export function cloneLoopState(s: LoopState): LoopState {
  return structuredClone(s);
}

/**
 * The function calls of the last model turn: the tail of the outputs after the last tool output.
 * At a boundary with `pending_tools` none of them has an output yet (outputs are appended only
 * after the boundary), so this works on a restored state without trusting call IDs to be unique.
 */
export function pendingCalls(outputs: readonly OutputItem[]): FunctionCallItem[] {
  const calls: FunctionCallItem[] = [];
  for (let i = outputs.length - 1; i >= 0; i--) {
    const item = outputs[i]!;
    if (item.type === 'function_call_output') break;
    if (item.type === 'function_call') calls.unshift(item as FunctionCallItem);
  }
  return calls;
}

export function addUsage(a: ResponsesUsage | null, b: ResponsesUsage | null): ResponsesUsage | null {
  if (!b) return a;
  if (!a) return { ...b };
  return {
    input_tokens: a.input_tokens + b.input_tokens,
    output_tokens: a.output_tokens + b.output_tokens,
    total_tokens: a.total_tokens + b.total_tokens,
  };
}
