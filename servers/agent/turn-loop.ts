// One activation's turn loop (participants.md §3.3). Boundaries: before the first model call (or
// the restored one), after a model response whose tools are pending, and after each tool round.
// All I/O and parking come in through `deps`, so the loop itself is plain control flow.
import { toChatMessages, type ModelTurn } from './chat-format.js';
import { addUsage, pendingCalls, type LoopState } from './loop-state.js';
import type { FunctionCallItem, OutputItem } from './wire.js';

export interface ToolOutcome {
  output: string;
  /** Cookies the resources server set (merged into the loop's resources cookies). */
  cookies: Record<string, string>;
  record: Record<string, unknown>;
}

export interface TurnLoopDeps {
  input: string | readonly unknown[];
  maxSteps: number;
  signal: AbortSignal;
  /** Record a boundary; parks there while a checkpoint wants the session parked. */
  boundary(state: LoopState): Promise<void>;
  /** One model call, made inside the "awaiting model" wrapper by the caller. */
  callModel(messages: ReturnType<typeof toChatMessages>, state: LoopState): Promise<ModelTurn & { cookies: Record<string, string> }>;
  callTool(call: FunctionCallItem, state: LoopState): Promise<ToolOutcome>;
}

export interface LoopOutcome {
  state: LoopState;
  incomplete: { reason: string } | null;
}

export async function runTurnLoop(state: LoopState, deps: TurnLoopDeps): Promise<LoopOutcome> {
  const s = state;
  await deps.boundary(s);
  for (;;) {
    deps.signal.throwIfAborted();
    if (!s.pending_tools) {
      const turn = await deps.callModel(toChatMessages(deps.input, s.new_outputs), s);
      deps.signal.throwIfAborted();
      s.step += 1;
      s.turns.push({ step: s.step, outputs_before: s.new_outputs.length, outputs: turn.items.length });
      s.new_outputs.push(...turn.items);
      s.usage = addUsage(s.usage, turn.usage);
      s.last_model_response = turn.response;
      if (Object.keys(turn.cookies).length) s.model_server_cookies = { ...s.model_server_cookies, ...turn.cookies };
      s.model_calls.push(turn.record);
      if (turn.incomplete) return { state: s, incomplete: turn.incomplete };
      if (!turn.items.some((i) => i.type === 'function_call')) return { state: s, incomplete: null };
      s.pending_tools = true;
      await deps.boundary(s);
    }
    const results: OutputItem[] = [];
    for (const call of pendingCalls(s.new_outputs)) {
      deps.signal.throwIfAborted();
      const r = await deps.callTool(call, s);
      results.push({ type: 'function_call_output', call_id: call.call_id, output: r.output });
      s.tool_records.push({ step: s.step, ...r.record });
      if (Object.keys(r.cookies).length) s.resources_server_cookies = { ...s.resources_server_cookies, ...r.cookies };
    }
    // Appended together so that `pendingCalls` never sees a half-finished round.
    s.new_outputs.push(...results);
    s.pending_tools = false;
    if (s.step >= deps.maxSteps) return { state: s, incomplete: null };
    await deps.boundary(s);
  }
}
