// The run report's I/O: the run's histories (every execution of its continue-as-new chain), its
// rollout shards' histories, its status query when it has no result, and checkpoint_metrics.jsonl
// → ReportInput (data.ts); then the page (html.ts) written to a file.
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { type Client, WorkflowNotFoundError } from '@temporalio/client';
import { CHECKPOINT_METRICS_FILE } from '../../activities/metrics.js';
import { runStatus } from '../../workflows/messages.js';
import { buildReportData, type HistoryEventLike, type ReportData, type ReportInput, runConfigOf, shardIdsOf, type WorkflowChain } from './data.js';
import { chartJsSource, renderReportHtml } from './html.js';

/** A user-facing failure (no such run), printed as is. */
export class ReportFailure extends Error {}

/** How long the status query of a run without a result may wait for a worker. */
const STATUS_WAIT_MS = 5_000;
/** Shard histories fetched at once. */
const FETCH_CONCURRENCY = 4;

/** Every execution of a workflow, oldest first: back from the newest along `continuedExecutionRunId`. */
export async function fetchChain(client: Client, workflowId: string): Promise<WorkflowChain> {
  const executions: HistoryEventLike[][] = [];
  let runId: string | undefined;
  const seen = new Set<string>();
  for (;;) {
    const history = await client.workflow.getHandle(workflowId, runId).fetchHistory();
    const events = (history.events ?? []) as HistoryEventLike[];
    executions.unshift(events);
    const prev = (history.events?.[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId ?? '') || undefined;
    if (!prev || seen.has(prev)) break;
    seen.add(prev);
    runId = prev;
  }
  return { workflowId, executions };
}

async function pool<T, R>(items: T[], n: number, fn: (x: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(n, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i]!);
      }
    }),
  );
  return out;
}

export interface CollectOptions {
  /** Where checkpoint_metrics.jsonl is (default: the run config's checkpoint_dir, relative to the current directory). */
  checkpointDir?: string;
}

export async function collectReportInput(client: Client, run: string, opts: CollectOptions = {}): Promise<ReportInput> {
  let chain: WorkflowChain;
  try {
    chain = await fetchChain(client, run);
  } catch (err) {
    if (err instanceof WorkflowNotFoundError) throw new ReportFailure(`no run named ${run} (namespace ${client.options.namespace})`);
    throw err;
  }
  const notes: string[] = [];
  const shards = await pool(shardIdsOf(chain), FETCH_CONCURRENCY, (id) =>
    fetchChain(client, id).catch((err: unknown) => {
      notes.push(`shard ${id}: history not available (${(err as Error).message}); its rollouts are missing from the timeline`);
      return { workflowId: id, executions: [] };
    }),
  );
  const newest = chain.executions[chain.executions.length - 1] ?? [];
  const hasResult = Boolean(newest[newest.length - 1]?.workflowExecutionCompletedEventAttributes);
  let status: ReportInput['status'] = null;
  if (!hasResult) {
    // A query needs a worker to answer: without one, the carried state stands in (data.ts says so).
    status = await client.connection
      .withDeadline(Date.now() + STATUS_WAIT_MS, () => client.workflow.getHandle(run).query(runStatus))
      .catch((err: unknown) => {
        notes.push(`the status query was not answered within ${STATUS_WAIT_MS / 1000} s (${(err as Error).message.split('\n')[0]})`);
        return null;
      });
  }
  const dir = opts.checkpointDir ?? runConfigOf(chain)?.run.checkpoint_dir;
  let metrics: ReportInput['metrics'] = null;
  if (dir) {
    const file = join(isAbsolute(dir) ? dir : resolve(dir), CHECKPOINT_METRICS_FILE);
    const text = await readFile(file, 'utf8').catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return null;
      throw err;
    });
    metrics = { file, text };
  }
  return { run: chain, shards, status, metrics, notes, generatedAt: new Date().toISOString() };
}

export interface WriteReportOptions extends CollectOptions {
  out: string;
}

/** Builds the run's report and writes it to `out` (atomically: a reader never sees half a page). */
export async function writeRunReport(client: Client, run: string, opts: WriteReportOptions): Promise<{ file: string; data: ReportData }> {
  const data = buildReportData(await collectReportInput(client, run, opts));
  const html = renderReportHtml(data, { chartJs: chartJsSource() });
  const file = resolve(opts.out);
  await mkdir(dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, html);
  await rename(tmp, file);
  return { file, data };
}

/** Where a run's report goes by default: `.data/reports/<run>.html` under `root`. */
export function defaultReportFile(root: string, run: string): string {
  return join(root, '.data', 'reports', `${run.replace(/[^\w.-]+/g, '_')}.html`);
}
