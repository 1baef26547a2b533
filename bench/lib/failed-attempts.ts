// Why the attempts of a run failed, from the Temporal server: each rollout attempt that did not
// complete its episode ends with its report as the workflow's result and its status in the
// `RolloutStatus` search attribute. Reads at most `limit` of them and counts their reasons, with
// the numbers in each reason (ports, IDs, milliseconds) blanked so that alike failures count as one.
import type { Client } from '@temporalio/client';
import type { RolloutReport } from '../../protocol/controller.js';
import { runQueries } from '../../workflows/search-attributes.js';

export interface FailedAttempts {
  /** How many the server lists (all of them, not only those read). */
  listed: number;
  read: number;
  /** Reason → count, most frequent first. */
  reasons: Array<[string, number]>;
}

export async function failedAttempts(client: Client, run: string, limit = 500): Promise<FailedAttempts> {
  const query = runQueries(run).unfinishedAttempts;
  const { count: listed } = await client.workflow.count(query);
  const counts = new Map<string, number>();
  let read = 0;
  for await (const w of client.workflow.list({ query })) {
    if (read >= limit) break;
    read++;
    const report = (await client.workflow
      .getHandle(w.workflowId, w.runId)
      .result()
      .catch((err: unknown) => ({ status: 'unreadable', reason: String(err) }))) as Pick<RolloutReport, 'status' | 'reason'>;
    const alike = String(report.reason ?? '').replace(/\d+/g, 'N');
    const reason = `${report.status}: ${alike.slice(0, 400)}`;
    counts.set(reason, (counts.get(reason) ?? 0) + 1);
  }
  return { listed, read, reasons: [...counts].sort((a, b) => b[1] - a[1]) };
}
