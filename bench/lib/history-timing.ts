// Where a workflow's time went, read from its event history: how long its workflow tasks and
// activities waited in the server's queues versus ran on a worker.
import type { WorkflowHandle } from '@temporalio/client';

export type HistoryEvents = NonNullable<Awaited<ReturnType<WorkflowHandle['fetchHistory']>>['events']>;

type EventTime = { seconds?: unknown; nanos?: number | null } | null | undefined;

export const eventMs = (t: EventTime): number => Number(t?.seconds ?? 0) * 1000 + (t?.nanos ?? 0) / 1e6;

/** An event's type as its attributes field names it (`activityTaskScheduled`, …). */
export function eventType(e: HistoryEvents[number]): string {
  const key = Object.keys(e).find((k) => k.endsWith('EventAttributes') && (e as Record<string, unknown>)[k]);
  return key ? key.replace('EventAttributes', '') : '?';
}

export interface TaskTimes {
  count: number;
  /** Scheduled → started, summed (ms): waiting for the server to hand the task to a worker. */
  queuedMs: number;
  /** Started → completed (or failed), summed (ms): the worker's part (and for an activity, the call). */
  busyMs: number;
}

/** The workflow tasks of one history. */
export function workflowTaskTimes(events: HistoryEvents): TaskTimes {
  const at = new Map<string, number>();
  const out: TaskTimes = { count: 0, queuedMs: 0, busyMs: 0 };
  for (const e of events) {
    const t = eventMs(e.eventTime);
    if (e.workflowTaskScheduledEventAttributes) at.set(String(e.eventId), t);
    const started = e.workflowTaskStartedEventAttributes;
    if (started) {
      out.queuedMs += t - (at.get(String(started.scheduledEventId)) ?? t);
      at.set(`started:${String(e.eventId)}`, t);
    }
    const done = e.workflowTaskCompletedEventAttributes;
    if (done) {
      out.count += 1;
      out.busyMs += t - (at.get(`started:${String(done.startedEventId)}`) ?? t);
    }
  }
  return out;
}

/** The activities of one history that completed, per activity type. */
export function activityTimes(events: HistoryEvents): Map<string, TaskTimes> {
  const scheduled = new Map<string, { name: string; at: number }>();
  const started = new Map<string, number>();
  const out = new Map<string, TaskTimes>();
  for (const e of events) {
    const t = eventMs(e.eventTime);
    const s = e.activityTaskScheduledEventAttributes;
    if (s) scheduled.set(String(e.eventId), { name: s.activityType?.name ?? '?', at: t });
    const st = e.activityTaskStartedEventAttributes;
    if (st) started.set(String(st.scheduledEventId), t);
    const c = e.activityTaskCompletedEventAttributes;
    if (c) {
      const from = scheduled.get(String(c.scheduledEventId));
      if (!from) continue;
      const begun = started.get(String(c.scheduledEventId)) ?? from.at;
      const acc = out.get(from.name) ?? { count: 0, queuedMs: 0, busyMs: 0 };
      acc.count += 1;
      acc.queuedMs += begun - from.at;
      acc.busyMs += t - begun;
      out.set(from.name, acc);
    }
  }
  return out;
}
