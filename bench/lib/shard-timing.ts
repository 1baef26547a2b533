// Where a checkpoint's candidates window went, shard by shard, read from the histories: when each
// shard got the attempt's request, when its next workflow task started and completed (the cut's
// local activity runs inside it), and when its answer reached the attempt. All in ms from the
// attempt's first event. Printed with BENCH_SHARD_TIMING=1.
import type { Client } from '@temporalio/client';
import { shardWorkflowId } from '../../workflows/shard-id.js';
import { eventMs, type HistoryEvents } from './history-timing.js';

export interface ShardTiming {
  shard: number;
  requestMs?: number;
  taskStartedMs?: number;
  taskCompletedMs?: number;
  answerMs?: number;
}

function signalPayload(e: HistoryEvents[number]): Record<string, unknown> | undefined {
  const data = e.workflowExecutionSignaledEventAttributes?.input?.payloads?.[0]?.data;
  if (!data) return undefined;
  try {
    return JSON.parse(Buffer.from(data).toString('utf8')) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

export async function shardTimings(client: Client, run: string, shards: number, attemptEvents: HistoryEvents): Promise<ShardTiming[]> {
  const first = eventMs(attemptEvents[0]?.eventTime);
  const out: ShardTiming[] = Array.from({ length: shards }, (_, shard) => ({ shard }));
  for (const e of attemptEvents) {
    if (e.workflowExecutionSignaledEventAttributes?.signalName !== 'shardAnswer') continue;
    const shard = Number(signalPayload(e)?.shard);
    const t = out[shard];
    if (t && t.answerMs === undefined) t.answerMs = eventMs(e.eventTime) - first;
  }
  await Promise.all(
    out.map(async (t) => {
      const events = await client.workflow
        .getHandle(shardWorkflowId(run, t.shard))
        .fetchHistory()
        .then((h) => h.events ?? [])
        .catch(() => []);
      for (const e of events) {
        const at = eventMs(e.eventTime) - first;
        if (at < -50) continue;
        if (t.requestMs === undefined) {
          if (e.workflowExecutionSignaledEventAttributes?.signalName === 'shardRequest' && signalPayload(e)?.kind === 'candidates') t.requestMs = at;
          continue;
        }
        if (t.taskStartedMs === undefined && e.workflowTaskStartedEventAttributes) t.taskStartedMs = at;
        else if (t.taskStartedMs !== undefined && e.workflowTaskCompletedEventAttributes) {
          t.taskCompletedMs = at;
          break;
        }
      }
    }),
  );
  return out;
}

const q = (xs: number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * (s.length - 1)))] ?? Number.NaN;
};

/** min / median / max of each column, and each shard's line. */
export function printShardTimings(timings: ShardTiming[]): void {
  const cols: Array<[string, (t: ShardTiming) => number | undefined]> = [
    ['request', (t) => t.requestMs],
    ['task started', (t) => t.taskStartedMs],
    ['task completed', (t) => t.taskCompletedMs],
    ['answer at attempt', (t) => t.answerMs],
  ];
  for (const [name, get] of cols) {
    const xs = timings.map(get).filter((x): x is number => x !== undefined);
    console.log(`    ${name.padEnd(18)} min ${q(xs, 0).toFixed(0)} median ${q(xs, 0.5).toFixed(0)} max ${q(xs, 1).toFixed(0)} ms (${xs.length})`);
  }
  const f = (x: number | undefined) => (x === undefined ? '-' : x.toFixed(0)).padStart(5);
  for (const t of [...timings].sort((a, b) => (a.answerMs ?? 1e9) - (b.answerMs ?? 1e9))) {
    console.log(
      `    shard ${String(t.shard).padStart(2)}: request ${f(t.requestMs)} started ${f(t.taskStartedMs)} completed ${f(t.taskCompletedMs)} answer ${f(t.answerMs)}`,
    );
  }
}
