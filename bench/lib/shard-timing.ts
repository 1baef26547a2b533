// Where a checkpoint's candidates window went, shard by shard, read from the histories: when each
// shard got the attempt's request, when its next workflow task started and completed (the cut's
// local activity runs inside it), and when its answer reached the attempt. All in ms from the
// attempt's first event. Printed with BENCH_SHARD_TIMING=1, after the last checkpoint.
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

/**
 * Each checkpoint attempt's timings (its history's events, in order), from every shard's history
 * fetched once: the bench asks after its last checkpoint, not between them, because the shards'
 * histories are large and this process is the controller's worker (fetching them between
 * checkpoints loaded it in the next one's window).
 */
export async function shardTimings(client: Client, run: string, shards: number, attempts: HistoryEvents[]): Promise<ShardTiming[][]> {
  const shardEvents = await Promise.all(
    Array.from({ length: shards }, (_, shard) =>
      client.workflow
        .getHandle(shardWorkflowId(run, shard))
        .fetchHistory()
        .then((h) => h.events ?? [])
        .catch(() => [] as HistoryEvents),
    ),
  );
  return attempts.map((attemptEvents) => timingsOf(attemptEvents, shardEvents));
}

function timingsOf(attemptEvents: HistoryEvents, shardEvents: HistoryEvents[]): ShardTiming[] {
  const first = eventMs(attemptEvents[0]?.eventTime);
  const out: ShardTiming[] = shardEvents.map((_, shard) => ({ shard }));
  for (const e of attemptEvents) {
    if (e.workflowExecutionSignaledEventAttributes?.signalName !== 'shardAnswer') continue;
    const shard = Number(signalPayload(e)?.shard);
    const t = out[shard];
    if (t && t.answerMs === undefined) t.answerMs = eventMs(e.eventTime) - first;
  }
  for (const t of out) {
    for (const e of shardEvents[t.shard]!) {
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
  }
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
