// How close one workflow came to Temporal's default limits, read from its event history: the most
// children and activities pending at once (2,000 each by default), the busiest stretch of signals
// into it, and its largest payload (2 MB per payload by default; we aim well under 256 KB).
import type { Client, WorkflowHandle } from '@temporalio/client';
import { eventMs, eventType, type HistoryEvents } from './history-timing.js';

export type History = Awaited<ReturnType<WorkflowHandle['fetchHistory']>>;

export interface WorkflowLimits {
  maxPendingChildren: number;
  maxPendingActivities: number;
  /** Signals received in the busiest window, per second. */
  maxSignalsPerS: number;
  /** The largest payload (bytes of data) any one event carries. */
  maxPayloadBytes: number;
  /** The type of the event that carries it. */
  maxPayloadEvent: string;
}

const CHILD_CLOSED = new Set([
  'childWorkflowExecutionCompleted',
  'childWorkflowExecutionFailed',
  'childWorkflowExecutionCanceled',
  'childWorkflowExecutionTimedOut',
  'childWorkflowExecutionTerminated',
  'startChildWorkflowExecutionFailed',
]);
const ACTIVITY_CLOSED = new Set(['activityTaskCompleted', 'activityTaskFailed', 'activityTaskTimedOut', 'activityTaskCanceled']);

/** Bytes of payload data anywhere in an event's attributes. */
function payloadBytes(v: unknown): number {
  if (v instanceof Uint8Array) return v.length;
  if (Array.isArray(v)) return v.reduce((n: number, x) => n + payloadBytes(x), 0);
  if (v && typeof v === 'object') {
    let n = 0;
    for (const [k, x] of Object.entries(v)) if (k !== 'metadata') n += payloadBytes(x);
    return n;
  }
  return 0;
}

/**
 * One workflow ID over all its executions (`runs`: each execution's events; it may have continued
 * as new): pending counts per execution (the server keeps them per execution), signals over all
 * of them (the rate into one workflow ID is what a cluster feels). `windowS`: the stretch over
 * which the signal rate counts as sustained.
 */
export function workflowLimits(runs: HistoryEvents[], windowS = 10): WorkflowLimits {
  const out: WorkflowLimits = { maxPendingChildren: 0, maxPendingActivities: 0, maxSignalsPerS: 0, maxPayloadBytes: 0, maxPayloadEvent: '' };
  const signals: number[] = [];
  for (const events of runs) {
    let children = 0;
    let activities = 0;
    for (const e of events) {
      const type = eventType(e);
      if (type === 'startChildWorkflowExecutionInitiated') children += 1;
      else if (CHILD_CLOSED.has(type)) children -= 1;
      else if (type === 'activityTaskScheduled') activities += 1;
      else if (ACTIVITY_CLOSED.has(type)) activities -= 1;
      else if (type === 'workflowExecutionSignaled') signals.push(eventMs(e.eventTime));
      out.maxPendingChildren = Math.max(out.maxPendingChildren, children);
      out.maxPendingActivities = Math.max(out.maxPendingActivities, activities);
      const bytes = payloadBytes(e);
      if (bytes > out.maxPayloadBytes) {
        out.maxPayloadBytes = bytes;
        out.maxPayloadEvent = type;
      }
    }
  }
  signals.sort((a, b) => a - b);
  for (let i = 0, j = 0; j < signals.length; j++) {
    while (signals[j]! - signals[i]! > windowS * 1000) i++;
    out.maxSignalsPerS = Math.max(out.maxSignalsPerS, (j - i + 1) / windowS);
  }
  return out;
}

/** The worst of each figure over several workflows. */
export function worstOf(all: WorkflowLimits[]): WorkflowLimits {
  const largest = all.reduce<WorkflowLimits | undefined>((a, l) => (a && a.maxPayloadBytes >= l.maxPayloadBytes ? a : l), undefined);
  return {
    maxPendingChildren: Math.max(0, ...all.map((l) => l.maxPendingChildren)),
    maxPendingActivities: Math.max(0, ...all.map((l) => l.maxPendingActivities)),
    maxSignalsPerS: Math.max(0, ...all.map((l) => l.maxSignalsPerS)),
    maxPayloadBytes: largest?.maxPayloadBytes ?? 0,
    maxPayloadEvent: largest?.maxPayloadEvent ?? '',
  };
}

/** Every execution of a workflow ID, latest first (it may have continued as new). */
export async function executions(client: Client, workflowId: string): Promise<History[]> {
  const out: History[] = [];
  for (let runId: string | undefined; ; ) {
    const h: History = await client.workflow.getHandle(workflowId, runId).fetchHistory();
    out.push(h);
    const prev = h.events?.[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId;
    if (!prev) return out;
    runId = prev;
  }
}

/** The limits of each workflow ID over all its executions, worst of all. */
export async function limitsOf(client: Client, workflowIds: readonly string[]): Promise<WorkflowLimits & { busiest: string; largestPayloadIn: string }> {
  const each = await Promise.all(workflowIds.map(async (id) => workflowLimits((await executions(client, id)).map((h) => h.events ?? []))));
  const worst = worstOf(each);
  // Which workflow took the most signals (the limit a cluster feels first).
  const busiest = workflowIds[each.findIndex((l) => l.maxSignalsPerS === worst.maxSignalsPerS)] ?? '';
  const largestIn = workflowIds[each.findIndex((l) => l.maxPayloadBytes === worst.maxPayloadBytes)] ?? '';
  return { ...worst, busiest, largestPayloadIn: `${largestIn} ${worst.maxPayloadEvent}`.trim() };
}
