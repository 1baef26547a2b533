// The controller's Temporal workers, in one process (or one of them: --only control|rollouts):
//  - the control task queue: every workflow, plus the coordination, snapshot and dataset activities;
//  - the rollout task queue: only the long `/run` activity, sized for thousands of concurrent rollouts,
//    so coordination calls never queue behind rollouts.
//   tsx worker.ts [--address 127.0.0.1:7233] [--namespace default] [--task-queue rollout-control] [--rollout-task-queue rollout-run] [--only control|rollouts]
//                 [--connect-timeout-s N] [--metrics-address IP:PORT] [--log-format json|text] [--otlp-endpoint URL]   (--help: WORKER_CLI)
// The Gym control token comes from GYM_CONTROL_TOKEN. A Temporal server that cannot be reached at
// start (not up yet, restarting) is retried with backoff, each try logged; by default for ever.
// Metrics, logs and tracing: worker-telemetry.ts (tracing's provider: servers/common/tracing.ts).
import { isIP } from 'node:net';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setTimeout as delay } from 'node:timers/promises';
import { ensureSearchAttributes } from './scripts/search-attributes.mjs';
import { type Logger, NativeConnection, TransportError, Worker, bundleWorkflowCode, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { closeActivityPools, createActivities, createActivityPools } from './activities/index.js';
import { RunKeeper } from './activities/run-keeper.js';
import { defineCommand, exitWithUsageError, parseCommandLine } from './scripts/cli.mjs';
import { OTLP_ENDPOINT_ENV, otlpTracesUrl, startTracing, type Tracing } from './servers/common/tracing.js';
import {
  JsonLogger,
  TRACING_INTERCEPTORS_PATH,
  bundleTraces,
  installWorkerRuntime,
  type LogFormat,
  tracingWorkerOptions,
  type WorkerLines,
  workerLines,
} from './worker-telemetry.js';

export interface ControllerWorkerOptions {
  address: string;
  namespace?: string;
  taskQueue?: string;
  rolloutTaskQueue?: string;
  controlToken: string;
  /**
   * One of the two workers only: `rollouts` keeps the parked `/run`s (a connection and some memory
   * each) and the attempt workflows in a process of its own, away from the control workflows'
   * collections; default both.
   */
  only?: WorkerRole;
  /** Reuse bundles across workers in one process (tests). */
  workflowBundle?: WorkflowBundleWithSourceMap;
  attemptBundle?: WorkflowBundleWithSourceMap;
  maxConcurrentRollouts?: number;
  /**
   * Threads running the control task queue's workflows (default 1). A checkpoint asks every
   * rollout shard at once and one thread answers them one after another; 2 threads shortened
   * admission closed at 8,000 in flight but the run's finish there fell into shard workflow-task
   * timeouts (docs/performance.md), so the default stays 1 until that is understood.
   */
  controlWorkflowThreads?: number;
  /** Give up connecting after this long (default: retry for ever). */
  connectTimeoutMs?: number;
  /** Where each failed connection try is reported (default: console.error, or a JSON line with `logFormat: 'json'`). */
  log?: (line: string) => void;
  /** Serve the SDK's and the controller's metrics for Prometheus on `IP:PORT` (`/metrics`). */
  metricsAddress?: string;
  /** `json`: the SDK's and the worker's logs as JSON lines on stderr; default `text` (the SDK's own). */
  logFormat?: LogFormat;
  /**
   * Trace workflows and activities into this process's provider (startTracing); the caller shuts it
   * down. Bundles passed in must then be built with `{ tracing: true }`, and without it otherwise.
   */
  tracing?: Tracing | undefined;
}

/** Which task queue a worker process polls (`--only`). */
export type WorkerRole = 'control' | 'rollouts';
export const WORKER_ROLES: readonly WorkerRole[] = ['control', 'rollouts'];

export interface ControllerWorkers {
  run(): Promise<void>;
  shutdown(): Promise<void>;
}

export const WORKFLOWS_PATH = fileURLToPath(new URL('./workflows/index.ts', import.meta.url));

export interface BundleOptions {
  /** With the tracing interceptors (workflows/tracing-interceptors.ts), for a worker that traces. */
  tracing?: boolean;
}

function interceptorModules(opts: BundleOptions): { workflowInterceptorModules?: string[] } {
  return opts.tracing ? { workflowInterceptorModules: [TRACING_INTERCEPTORS_PATH] } : {};
}

/** `logger`: where the bundler's lines go (default: the SDK's plain lines). */
export async function bundleWorkflows(logger?: Logger, opts: BundleOptions = {}): Promise<WorkflowBundleWithSourceMap> {
  return bundleWorkflowCode({ workflowsPath: WORKFLOWS_PATH, logger, ...interceptorModules(opts) });
}

export const ATTEMPT_WORKFLOWS_PATH = fileURLToPath(new URL('./workflows/attempt-index.ts', import.meta.url));

/** The rollout worker's bundle: the rollout attempt alone (workflows/attempt-index.ts). */
export async function bundleAttemptWorkflows(logger?: Logger, opts: BundleOptions = {}): Promise<WorkflowBundleWithSourceMap> {
  return bundleWorkflowCode({ workflowsPath: ATTEMPT_WORKFLOWS_PATH, logger, ...interceptorModules(opts) });
}

/** Waits before connection try `n` (from 0): 0.5 s doubling to 10 s. */
export function connectBackoffMs(n: number): number {
  return Math.min(10_000, 500 * 2 ** n);
}

/**
 * Connects and creates both workers, retrying with backoff while the Temporal server cannot be
 * reached (it is not up yet, or restarting): a starting worker rides that out as a running one does.
 * Anything else (a namespace that does not exist, bad options) fails at once.
 */
async function connectWorkers(
  opts: ControllerWorkerOptions,
  create: (connection: NativeConnection) => Promise<Worker[]>,
): Promise<{ connection: NativeConnection; workers: Worker[] }> {
  const lines = workerLines(opts.logFormat ?? 'text');
  const log = opts.log ?? ((line: string) => lines.warn(line));
  const giveUpAt = opts.connectTimeoutMs === undefined ? Infinity : Date.now() + opts.connectTimeoutMs;
  for (let n = 0; ; n++) {
    let connection: NativeConnection | undefined;
    try {
      connection = await NativeConnection.connect({ address: opts.address });
      return { connection, workers: await create(connection) };
    } catch (err) {
      await connection?.close().catch(() => undefined);
      if (!(err instanceof TransportError)) throw err;
      const wait = connectBackoffMs(n);
      if (Date.now() + wait > giveUpAt)
        throw new Error(`worker: Temporal at ${opts.address} did not answer within ${opts.connectTimeoutMs} ms: ${err.message}`);
      log(`worker: cannot reach Temporal at ${opts.address} (try ${n + 1}: ${err.message.split('\n')[0]}); retrying in ${(wait / 1000).toFixed(1)} s`);
      await delay(wait);
    }
  }
}

/** The controller's search attributes registered in `namespace` (scripts/search-attributes.mjs); the ones added are logged. */
async function registerSearchAttributes(connection: NativeConnection, namespace: string, opts: ControllerWorkerOptions): Promise<void> {
  const added = await ensureSearchAttributes(connection, namespace);
  if (added.length === 0) return;
  const line = `worker: registered the search attributes ${added.join(', ')} in namespace ${namespace}`;
  (opts.log ?? ((l: string) => workerLines(opts.logFormat ?? 'text').info(l)))(line);
}

/** How long a stopping worker waits for its `/run` outcomes to reach the server. */
const RUN_OUTCOMES_DRAIN_MS = 10_000;

export async function createControllerWorkers(opts: ControllerWorkerOptions): Promise<ControllerWorkers> {
  // Before the first connection: the SDK's Runtime is created once per process.
  installWorkerRuntime({ metricsAddress: opts.metricsAddress, logFormat: opts.logFormat });
  const bundleLog = opts.logFormat === 'json' ? new JsonLogger() : undefined;
  const tracing = opts.tracing !== undefined;
  const control = opts.only !== 'rollouts';
  const rollouts = opts.only !== 'control';
  const [workflowBundle, attemptBundle] = await Promise.all([
    control ? (opts.workflowBundle ?? bundleWorkflows(bundleLog, { tracing })) : undefined,
    rollouts ? (opts.attemptBundle ?? bundleAttemptWorkflows(bundleLog, { tracing })) : undefined,
  ]);
  // A bundle without the interceptors would trace nothing in its workflows; one with them and no
  // sink would report every span it ends as a call to a sink that does not exist.
  for (const bundle of [workflowBundle, attemptBundle].filter((b) => b !== undefined))
    if (bundleTraces(bundle) !== tracing)
      throw new Error(
        `worker: a workflow bundle built ${tracing ? 'without' : 'with'} { tracing: true } for a worker that ${tracing ? 'traces' : 'does not trace'}`,
      );
  const traced = opts.tracing ? tracingWorkerOptions(opts.tracing) : {};
  // The worker owns the activities' HTTP pools: made here, closed once both workers have stopped.
  const pools = createActivityPools();
  // The `/run`s are kept by one keeper: their heartbeats and outcomes paced (activities/run-keeper.ts).
  const lines = workerLines(opts.logFormat ?? 'text');
  const runKeeper = new RunKeeper({ log: (message, fields) => lines.warn(`worker: ${message}`, fields) });
  const activities = createActivities({ controlToken: opts.controlToken, pools, runKeeper });
  const namespace = opts.namespace ?? 'default';
  const { connection, workers } = await connectWorkers(opts, async (connection) => {
    // Before any workflow runs: one that sets an unregistered search attribute would fail its tasks.
    await registerSearchAttributes(connection, namespace, opts);
    const created: Worker[] = [];
    if (workflowBundle) {
      created.push(
        await Worker.create({
          connection,
          namespace,
          taskQueue: opts.taskQueue ?? 'rollout-control',
          workflowBundle,
          activities,
          maxConcurrentActivityTaskExecutions: 200,
          maxConcurrentWorkflowTaskExecutions: 64,
          maxCachedWorkflows: 4_000,
          workflowThreadPoolSize: opts.controlWorkflowThreads ?? 1,
          ...traced,
        }),
      );
    }
    if (attemptBundle) {
      created.push(
        await Worker.create({
          connection,
          namespace,
          taskQueue: opts.rolloutTaskQueue ?? 'rollout-run',
          // The attempt workflows and their `/run`s: an attempt's activity is dispatched eagerly to
          // this worker with its workflow task's completion.
          workflowBundle: attemptBundle,
          activities: { runEpisode: activities.runEpisode },
          maxConcurrentWorkflowTaskExecutions: 64,
          // No cache, so no sticky queue: an attempt's history is a dozen events, replayed whole at
          // each of its few tasks. With a sticky queue the SDK polls the shared queue with a fifth
          // of its pollers, and every attempt's first task and (once evicted) its last come there:
          // dispatch and the finish after a checkpoint's release waited on those few pollers, and
          // a released burst's tasks timed out on the sticky queue first (docs/performance.md).
          maxCachedWorkflows: 0,
          // A `/run`'s activity holds its slot only until it hands the call to the run keeper.
          maxConcurrentActivityTaskExecutions: opts.maxConcurrentRollouts ?? 5_000,
          maxConcurrentActivityTaskPolls: 20,
          ...traced,
        }),
      );
    }
    return created;
  });
  let running: Promise<void> | undefined;
  return {
    run() {
      // The `/run`s still open are failed as retryable (another worker's retry attaches to their
      // episodes) and the outcomes go out before the connection closes (what does not, the server retries).
      running ??= Promise.all(workers.map((w) => w.run())).then(() =>
        runKeeper.shutdown(RUN_OUTCOMES_DRAIN_MS).then(() => Promise.all([connection.close(), closeActivityPools(pools)]).then(() => {})),
      );
      return running;
    },
    async shutdown() {
      for (const w of workers) w.shutdown();
      await running;
    },
  };
}

const WORKER_CLI = defineCommand({
  name: 'worker',
  invocation: 'npm run worker',
  usage: [
    'npm run worker -- [--address HOST:PORT] [--namespace NS] [--task-queue Q] [--rollout-task-queue Q] [--only control|rollouts] [--connect-timeout-s N]',
    '                  [--metrics-address IP:PORT] [--log-format json|text] [--otlp-endpoint URL]',
  ],
  summary:
    "The controller's Temporal workers in one process: every workflow and the coordination, snapshot and dataset activities on the control task queue; " +
    "only the rollouts' attempt workflows and their long /run activity on the rollout task queue (--only: one of the two, e.g. several rollout processes beside one control process). " +
    'A Temporal server that cannot be reached is retried with backoff, each try logged.',
  flags: {
    address: { type: 'string', value: 'HOST:PORT', help: 'the Temporal frontend (default: $TEMPORAL_ADDRESS, else 127.0.0.1:7233)' },
    namespace: { type: 'string', value: 'NS', help: 'the Temporal namespace (default: default)' },
    'task-queue': { type: 'string', value: 'Q', help: "the control task queue, a run config's run.task_queue (default: rollout-control)" },
    'rollout-task-queue': { type: 'string', value: 'Q', help: "the rollout task queue, a run config's run.rollout_task_queue (default: rollout-run)" },
    only: {
      type: 'string',
      value: 'control|rollouts',
      help: 'poll one task queue only: control (the workflows and coordination) or rollouts (the attempts and their /run calls), so that thousands of parked /run calls live in processes of their own (default: both)',
    },
    'connect-timeout-s': { type: 'string', value: 'N', help: 'give up after N seconds without a Temporal server (default: retry for ever)' },
    'metrics-address': {
      type: 'string',
      value: 'IP:PORT',
      help: "serve Prometheus metrics on http://IP:PORT/metrics: the SDK's (temporal_*) and the controller's (controller_*) (default: $WORKER_METRICS_ADDRESS, else none)",
    },
    'log-format': {
      type: 'string',
      value: 'json|text',
      help: "json: every log line a JSON object on stderr (pino's level, time, msg); text: the SDK's plain lines (default: $WORKER_LOG_FORMAT, else json)",
    },
    'otlp-endpoint': {
      type: 'string',
      value: 'URL',
      help: 'trace workflows, activities and their calls into Gym with OpenTelemetry, sent over OTLP/HTTP to URL/v1/traces, e.g. http://127.0.0.1:4318 (default: $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing)',
    },
  },
  env: [
    { name: 'GYM_CONTROL_TOKEN', help: "required: the Gym deployment's checkpoint control token" },
    { name: 'TEMPORAL_ADDRESS', help: 'the Temporal frontend, when --address is not given' },
    { name: 'WORKER_METRICS_ADDRESS', help: 'the metrics address, when --metrics-address is not given' },
    { name: 'WORKER_LOG_FORMAT', help: 'json or text, when --log-format is not given' },
    { name: 'OTEL_EXPORTER_OTLP_ENDPOINT', help: 'the OTLP endpoint, when --otlp-endpoint is not given (the Gym servers read it too)' },
  ],
  notes: ['SIGINT or SIGTERM shuts the workers down gracefully.'],
});

/** The worker's own lines as JSON, once main() has chosen that format (before, and for text: plain). */
let jsonLines: WorkerLines | undefined;

async function main(): Promise<void> {
  const { values: given } = parseCommandLine(WORKER_CLI, process.argv.slice(2));
  const values = {
    address: given.address ?? process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233',
    namespace: given.namespace ?? 'default',
    'task-queue': given['task-queue'] ?? 'rollout-control',
    'rollout-task-queue': given['rollout-task-queue'] ?? 'rollout-run',
    only: given.only,
    'connect-timeout-s': given['connect-timeout-s'],
    // An empty variable counts as unset.
    'metrics-address': given['metrics-address'] ?? (process.env.WORKER_METRICS_ADDRESS || undefined),
    'log-format': given['log-format'] ?? (process.env.WORKER_LOG_FORMAT || 'json'),
    'otlp-endpoint': given['otlp-endpoint'] ?? (process.env.OTEL_EXPORTER_OTLP_ENDPOINT || undefined),
  };
  const only = values.only;
  if (only !== undefined && !WORKER_ROLES.includes(only as WorkerRole)) exitWithUsageError(WORKER_CLI, `--only must be control or rollouts, not '${only}'`);
  const logFormat = values['log-format'];
  if (logFormat !== 'json' && logFormat !== 'text') exitWithUsageError(WORKER_CLI, `--log-format must be json or text, not '${logFormat}'`);
  const metricsAddress = values['metrics-address'];
  if (metricsAddress !== undefined && !isSocketAddress(metricsAddress)) {
    exitWithUsageError(WORKER_CLI, `--metrics-address must be an IP address and a port (e.g. 127.0.0.1:9464 or [::]:9464), not '${metricsAddress}'`);
  }
  const otlpEndpoint = values['otlp-endpoint'];
  if (otlpEndpoint !== undefined) {
    try {
      otlpTracesUrl(otlpEndpoint);
    } catch (err) {
      exitWithUsageError(WORKER_CLI, `--otlp-endpoint (or ${OTLP_ENDPOINT_ENV}): ${(err as Error).message}`);
    }
  }
  const lines = workerLines(logFormat);
  if (logFormat === 'json') jsonLines = lines;
  const connectTimeoutS = values['connect-timeout-s'] === undefined ? undefined : Number(values['connect-timeout-s']);
  if (connectTimeoutS !== undefined && !(connectTimeoutS > 0)) {
    console.error('worker: --connect-timeout-s must be a positive number of seconds');
    process.exit(2);
  }
  const controlToken = process.env.GYM_CONTROL_TOKEN;
  if (!controlToken) {
    console.error('worker: set GYM_CONTROL_TOKEN (the Gym deployment control token)');
    process.exit(2);
  }
  const tracing = await startTracing({ serviceName: 'rollout-controller', otlpEndpoint });
  const workers = await createControllerWorkers({
    address: values.address!,
    namespace: values.namespace,
    taskQueue: values['task-queue'],
    rolloutTaskQueue: values['rollout-task-queue'],
    ...(only !== undefined ? { only: only as WorkerRole } : {}),
    controlToken,
    ...(connectTimeoutS !== undefined ? { connectTimeoutMs: connectTimeoutS * 1000 } : {}),
    ...(metricsAddress !== undefined ? { metricsAddress } : {}),
    logFormat,
    tracing,
  });
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => void workers.shutdown());
  const polled =
    only === 'control'
      ? values['task-queue']
      : only === 'rollouts'
        ? values['rollout-task-queue']
        : `${values['task-queue']} and ${values['rollout-task-queue']}`;
  lines.info(`worker: polling ${polled} on ${values.address}`, {
    ...(metricsAddress !== undefined ? { metricsAddress } : {}),
    ...(tracing ? { otlpEndpoint } : {}),
  });
  await workers.run();
  // The spans still batched go out before the process ends.
  await tracing?.shutdown();
}

/** `IP:PORT` (IPv6 in brackets), as the SDK's metrics exporter binds it: no host names. */
function isSocketAddress(address: string): boolean {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(address);
  if (!m) return false;
  const port = Number(m[3]);
  return port >= 0 && port <= 65_535 && (m[1] !== undefined ? isIP(m[1]) === 6 : isIP(m[2]!) === 4);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    if (jsonLines) jsonLines.error(err instanceof Error ? err.message : String(err), { err });
    else console.error(err);
    process.exit(1);
  });
}
