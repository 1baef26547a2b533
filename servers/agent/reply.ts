// The Responses-style reply of an activation and the observations a close returns
// (docs/gym-servers.md, participants.md §3.2–3.4).
import { createHash, randomUUID } from 'node:crypto';
import type { LoopState } from './loop-state.js';
import type { Observations } from './wire.js';

/** Stable per (session, activation), so a re-run after a restore answers with the same ID. */
export function responseId(sessionKey: string | undefined, index: number): string {
  if (sessionKey === undefined) return `resp_${randomUUID().replaceAll('-', '')}`;
  return `resp_${createHash('sha256').update(`${sessionKey}:${index}`).digest('hex').slice(0, 32)}`;
}

export function trajectoryOf(invocationId: string, state: LoopState): Record<string, unknown> {
  return {
    invocation_id: invocationId,
    turns: state.turns,
    tool_records: state.tool_records,
    model_calls: state.model_calls,
    gaps: state.gaps,
  };
}

export function buildResponse(opts: {
  id: string;
  state: LoopState;
  incomplete: { reason: string } | null;
  /** Only without an activation index (§3.4 step 5: the environment reads observations instead). */
  trajectory?: Record<string, unknown>;
}): Record<string, unknown> {
  const last = opts.state.last_model_response;
  return {
    id: opts.id,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    model: typeof last?.model === 'string' ? last.model : 'policy',
    status: opts.incomplete ? 'incomplete' : 'completed',
    output: opts.state.new_outputs,
    usage: opts.state.usage,
    incomplete_details: opts.incomplete,
    ...(opts.trajectory ? { _ng_trajectory: opts.trajectory } : {}),
  };
}

export function emptyObservations(): Observations {
  return { source: 'simple_agent', records: [], gaps: [] };
}

/** Observations after one activation: its record appended, its gaps carried over. */
export function withActivation(prev: Observations | null, record: Record<string, unknown>, gaps: readonly unknown[]): Observations {
  const base = prev ?? emptyObservations();
  return { source: 'simple_agent', records: [...base.records, record], gaps: [...base.gaps, ...gaps] };
}

export function withGap(prev: Observations | null, gap: Record<string, unknown>): Observations {
  const base = prev ?? emptyObservations();
  return { source: 'simple_agent', records: base.records, gaps: [...base.gaps, gap] };
}
