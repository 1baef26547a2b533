// Idempotent activations (participants.md §3.4): what to do with an activation request given the
// session's counters and the `x-ng-agent-activation` index. Pure.
import { refuse } from '../../protocol/errors.js';

export const ACTIVATION_HEADER = 'x-ng-agent-activation';

export type ActivationDecision =
  /** Return the kept reply of the last completed activation; no model or tool call. */
  | { kind: 'replay' }
  /** Run activation `index`. */
  | { kind: 'run'; index: number }
  /** That activation is still running: wait for it and return its reply. */
  | { kind: 'wait' }
  /** Another activation of the session is running (requests without an index). */
  | { kind: 'busy' }
  | { kind: 'out_of_order'; detail: string };

export interface ActivationCounters {
  activations: number;
  completedActivation: number;
  hasCompletedReply: boolean;
  runningIndex: number | undefined;
}

/** The header's value: undefined when absent; a refusal when not a positive decimal integer. */
export function parseActivationIndex(header: string | string[] | undefined): number | undefined {
  if (header === undefined) return undefined;
  const text = Array.isArray(header) ? (header[0] ?? '') : header;
  const trimmed = text.trim();
  const n = /^[0-9]+$/.test(trimmed) ? Number(trimmed) : NaN;
  if (!Number.isSafeInteger(n) || n < 1) {
    throw refuse('activation_out_of_order', `${ACTIVATION_HEADER} must be a positive integer, got ${JSON.stringify(text)}`);
  }
  return n;
}

export function decideActivation(c: ActivationCounters, index: number | undefined): ActivationDecision {
  if (index === undefined) {
    // Without the header every invocation is a new activation.
    return c.runningIndex !== undefined ? { kind: 'busy' } : { kind: 'run', index: c.activations + 1 };
  }
  if (c.runningIndex !== undefined && index === c.runningIndex) return { kind: 'wait' };
  const completed = c.completedActivation;
  if (index === completed) {
    if (completed > 0 && c.hasCompletedReply) return { kind: 'replay' };
    return { kind: 'out_of_order', detail: `activation ${index} has no kept reply (completed: ${completed})` };
  }
  if (index === completed + 1) {
    if (c.runningIndex !== undefined) return { kind: 'busy' };
    return { kind: 'run', index };
  }
  return { kind: 'out_of_order', detail: `activation ${index} is neither the last completed (${completed}) nor the next one` };
}

/** `root` for the first activation, `activation-<n>` for later ones (§3.4 step 4). */
export function invocationId(index: number): string {
  return index <= 1 ? 'root' : `activation-${index}`;
}
