// Completed rollout reports on their way from the `/run` activities to their shards, batched per
// shard: at a release thousands of `/run`s end within seconds, and one signal per report took a
// shard to ~21 signals a second, past the ~20 a workflow should take (docs/performance.md,
// controller-scale at 16,000). This worker sends a shard at most one signal at a time and at most
// one per `minIntervalMs`; what comes in meanwhile goes out together in the next one. A lone report
// goes out at once.
import { WorkflowNotFoundError, type Client } from '@temporalio/client';
import type { RolloutReport } from '../protocol/controller.js';
import { rolloutsFinished } from '../workflows/messages.js';

/** Least time between two signals of this worker to one shard. */
export const REPORT_BATCH_INTERVAL_MS = 200;
/** Reports in one signal at most (a report is a few hundred bytes: far below the payload limit). */
export const REPORT_BATCH_MAX = 200;

/** How a report's delivery ended: sent, or its shard is gone (the caller keeps the report). */
export type Delivery = 'sent' | 'not_found';

interface Waiting {
  report: RolloutReport;
  resolve(d: Delivery): void;
  reject(err: unknown): void;
}

interface Target {
  waiting: Waiting[];
  sending: boolean;
  lastSentAt: number;
  timer?: NodeJS.Timeout;
}

const NEVER_ABORTED = new AbortController().signal;

export class ReportBatches {
  private readonly targets = new Map<string, Target>();

  constructor(
    private readonly client: Client,
    private readonly minIntervalMs = REPORT_BATCH_INTERVAL_MS,
    private readonly max = REPORT_BATCH_MAX,
  ) {}

  /** Resolves once the shard has the report (or is gone); rejects when its signal failed (send it again). */
  deliver(reportTo: string, report: RolloutReport): Promise<Delivery> {
    let t = this.targets.get(reportTo);
    if (!t) this.targets.set(reportTo, (t = { waiting: [], sending: false, lastSentAt: 0 }));
    const done = new Promise<Delivery>((resolve, reject) => t.waiting.push({ report, resolve, reject }));
    this.schedule(reportTo, t);
    return done;
  }

  /** Sends what waits once the interval since the last signal has passed; forgets an idle shard then. */
  private schedule(reportTo: string, t: Target): void {
    if (t.sending || t.timer) return;
    const wait = t.lastSentAt + this.minIntervalMs - Date.now();
    if (wait > 0) {
      t.timer = setTimeout(() => {
        t.timer = undefined;
        this.schedule(reportTo, t);
      }, wait).unref();
    } else if (t.waiting.length > 0) {
      void this.send(reportTo, t);
    } else {
      this.targets.delete(reportTo);
    }
  }

  private async send(reportTo: string, t: Target): Promise<void> {
    const batch = t.waiting.splice(0, this.max);
    t.sending = true;
    t.lastSentAt = Date.now();
    try {
      // Client calls inherit the abort signal of the activity whose context makes them; a batch
      // carries other activities' reports too, so it is not cancelled with that one.
      await this.client.withAbortSignal(NEVER_ABORTED, () =>
        this.client.workflow.getHandle(reportTo).signal(
          rolloutsFinished,
          batch.map((w) => w.report),
        ),
      );
      for (const w of batch) w.resolve('sent');
    } catch (err) {
      for (const w of batch) {
        if (err instanceof WorkflowNotFoundError) w.resolve('not_found');
        else w.reject(err);
      }
    } finally {
      t.sending = false;
      this.schedule(reportTo, t);
    }
  }
}

const byClient = new WeakMap<Client, ReportBatches>();

/** The batches of this worker's client (one per client: each is one worker's connection). */
export function reportBatchesOf(client: Client): ReportBatches {
  let b = byClient.get(client);
  if (!b) byClient.set(client, (b = new ReportBatches(client)));
  return b;
}
