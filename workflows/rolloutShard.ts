// One rollout shard of a training run (ID `<run>/shard/<k>`): starts the rollout attempts the run
// hands it, as its own children, and sends their reports up to the run in batches. So the run owns
// no attempt workflow and hears a few signals a second however many attempts are in flight:
// Temporal's default limits allow 2,000 pending children per workflow and a few signals a second
// into one. The run keeps the ledger, the clocks and every decision; a shard only starts and relays.
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import {
  ParentClosePolicy,
  WorkflowIdReusePolicy,
  allHandlersFinished,
  condition,
  continueAsNew,
  defineQuery,
  getExternalWorkflowHandle,
  isCancellation,
  log,
  setHandler,
  sleep,
  startChild,
  workflowInfo,
} from '@temporalio/workflow';
import type { RolloutReport } from '../protocol/controller.js';
import { captureKey, type CaptureKey } from '../protocol/episode-id.js';
import { closeShard, rolloutFinished, rolloutsFinished, startAttempts, type AttemptStarts } from './messages.js';
import { rolloutAttempt, rolloutWorkflowId, type RolloutAttemptInput } from './rolloutAttempt.js';

/** Child starts per workflow task: each task's commands stay small; the loop comes straight back. */
const MAX_STARTS_PER_TASK = 250;
/** Reports per signal to the run: a few tens of KB. */
const MAX_REPORTS_PER_SIGNAL = 200;

export interface RolloutShardInput {
  run: string;
  runWorkflowId: string;
  shard: number;
  /** The settings every attempt it starts shares. */
  attempts: Pick<RolloutAttemptInput, 'controlTaskQueue' | 'runTaskQueue' | 'retireTimeoutS' | 'runHeartbeatTimeoutS' | 'scheduleToStartTimeoutS'>;
  /** The task queue of the attempt workflows. */
  taskQueue: string;
  /** Least time between two report batches: the run's signal rate stays bounded, however many shards. */
  flushIntervalMs: number;
  /** Continue-as-new past this many events. */
  maxHistoryEvents: number;
  /** Carried across continue-as-new. */
  carried?: ShardState;
}

export interface ShardState {
  queue: AttemptStarts[];
  reports: RolloutReport[];
  /** Started by this shard, not reported yet. */
  inFlight: CaptureKey[];
}

export interface ShardStatus {
  shard: number;
  inFlight: number;
  queued: number;
  reportsUnsent: number;
}
export const shardStatus = defineQuery<ShardStatus>('shardStatus');

export function shardWorkflowId(run: string, shard: number): string {
  return `${run}/shard/${shard}`;
}

export async function rolloutShard(input: RolloutShardInput): Promise<void> {
  const queue: AttemptStarts[] = input.carried?.queue ?? [];
  let reports: RolloutReport[] = input.carried?.reports ?? [];
  const inFlight = new Set<CaptureKey>(input.carried?.inFlight ?? []);
  let closed = false;
  let changed = false;
  /** A batch went up less than `flushIntervalMs` ago (a timer, not the clock: see flush()). */
  let pacing = false;
  const selfId = workflowInfo().workflowId;

  setHandler(startAttempts, (batch) => {
    queue.push(batch);
    changed = true;
  });
  setHandler(rolloutFinished, (r) => {
    reports.push(r);
    inFlight.delete(r.captureKey);
    changed = true;
  });
  setHandler(closeShard, () => {
    closed = true;
    changed = true;
  });
  setHandler(shardStatus, () => ({
    shard: input.shard,
    inFlight: inFlight.size,
    queued: queue.reduce((n, b) => n + b.attempts.length, 0),
    reportsUnsent: reports.length,
  }));

  async function startQueued(): Promise<void> {
    let budget = MAX_STARTS_PER_TASK;
    const starts: Array<Promise<void>> = [];
    while (queue.length && budget > 0) {
      const batch = queue[0]!;
      const take = batch.attempts.splice(0, budget);
      if (batch.attempts.length === 0) queue.shift();
      budget -= take.length;
      for (const a of take) {
        const key = captureKey(a.episode);
        inFlight.add(key);
        const { summary, details, ...start } = a;
        const args: RolloutAttemptInput = { run: input.run, reportTo: selfId, ...start, topology: batch.topology, ...input.attempts };
        starts.push(
          startChild(rolloutAttempt, {
            workflowId: rolloutWorkflowId(input.run, a.episode),
            taskQueue: input.taskQueue,
            parentClosePolicy: ParentClosePolicy.ABANDON,
            // An attempt runs once: a start repeated after it ended must not run it again.
            workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
            staticSummary: summary,
            staticDetails: details,
            args: [args],
          }).then(
            () => undefined,
            (err: unknown) => {
              // Already started (a start recorded before a continue-as-new): it reports here by signal.
              if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
            },
          ),
        );
      }
    }
    await Promise.all(starts);
    if (queue.length) changed = true;
  }

  /**
   * Sends the reports up; false when the run is gone (nobody to report to). The pause before the
   * next batch is a timer whose firing is in the history: a decision on `Date.now()` could differ on
   * replay, since the SDK may run a workflow's code with the clock of an older task (on a fresh
   * worker answering a query, see docs/controller.md).
   */
  async function flush(): Promise<boolean> {
    pacing = true;
    void sleep(input.flushIntervalMs).then(() => {
      pacing = false;
      changed = true;
    });
    while (reports.length) {
      const batch = reports.slice(0, MAX_REPORTS_PER_SIGNAL);
      try {
        await getExternalWorkflowHandle(input.runWorkflowId).signal(rolloutsFinished, batch);
      } catch (err) {
        if (isCancellation(err)) throw err;
        log.warn('the run is gone; dropping its reports', { reports: reports.length, error: String(err) });
        reports = [];
        return false;
      }
      reports = reports.slice(batch.length);
    }
    return true;
  }

  for (;;) {
    changed = false;
    await startQueued();
    if (reports.length && (closed || !pacing)) {
      if (!(await flush())) return;
    }
    // Closed by the run at its end: nothing of it is in flight any more (or it failed and no one listens).
    if (closed && reports.length === 0) return;
    const info = workflowInfo();
    if (info.historyLength > input.maxHistoryEvents || info.continueAsNewSuggested) {
      await condition(allHandlersFinished);
      const carried: ShardState = { queue, reports, inFlight: [...inFlight] };
      await continueAsNew<typeof rolloutShard>({ ...input, carried });
    }
    if (changed) continue;
    await condition(() => changed);
  }
}
