// The worker process's telemetry, set on the SDK's Runtime: a Prometheus endpoint with the SDK's
// worker metrics and the controller's (workflows/metrics.ts), and logs as JSON lines with the field
// names of the Gym servers' pino logs (`level` as pino's number, `time` in epoch ms, `msg`). The
// Runtime is one per process and must exist before the first connection: installWorkerRuntime()
// installs it, or checks that the one already there serves what is asked. Tracing (OpenTelemetry,
// off by default): the Worker options of tracingWorkerOptions() with servers/common/tracing.ts.
import { fileURLToPath } from 'node:url';
import {
  OpenTelemetryActivityInboundInterceptor,
  OpenTelemetryActivityOutboundInterceptor,
  makeWorkflowExporter,
} from '@temporalio/interceptors-opentelemetry/lib/worker/index.js';
import type { OpenTelemetryWorkflowExporter } from '@temporalio/interceptors-opentelemetry/lib/workflow/definitions.js';
import {
  DefaultLogger,
  type InjectedSink,
  type LogEntry,
  type LogLevel,
  type LogMetadata,
  Runtime,
  type RuntimeOptions,
  type WorkerOptions,
} from '@temporalio/worker';
import type { Tracing } from './servers/common/tracing.js';
import { SECONDS_BUCKETS } from './protocol/metric-buckets.js';
import { METRICS } from './workflows/metrics.js';

export type LogFormat = 'json' | 'text';

export interface WorkerTelemetry {
  /** `IP:PORT` of the Prometheus endpoint (`GET /metrics`); none if unset. */
  metricsAddress?: string | undefined;
  /** `json`: the SDK's log lines and the worker's own as JSON objects on stderr; `text` (default): the SDK's plain lines. */
  logFormat?: LogFormat | undefined;
}

/** pino's numeric levels. */
const LEVELS: Record<LogLevel, number> = { TRACE: 10, DEBUG: 20, INFO: 30, WARN: 40, ERROR: 50 };

/** Our workflow types: their IDs start with the run name (`<run>`, `<run>/shard/<k>`, `<run>/checkpoint/<id>`, `<run>/rollout/<key>`). */
const RUN_WORKFLOWS = new Set(['trainingRun', 'rolloutShard', 'checkpointAttempt', 'rolloutAttempt']);
/** The log format's names for fields the code calls otherwise. */
const RENAMED: Record<string, string> = { checkpointId: 'checkpoint_id', captureKey: 'capture_key' };
const OWN = new Set(['level', 'time', 'component', 'msg']);

function after(id: string, marker: string): string | undefined {
  const i = id.indexOf(marker);
  return i < 0 ? undefined : id.slice(i + marker.length);
}

/** One log entry as the JSON line's object: level, time, component, the metadata flattened, run fields, msg. */
export function logRecord(entry: LogEntry): Record<string, unknown> {
  const out: Record<string, unknown> = { level: LEVELS[entry.level] ?? 30, time: Number(entry.timestampNanos / 1_000_000n), component: 'worker' };
  const meta: LogMetadata = entry.meta ?? {};
  for (const [k, v] of Object.entries(meta)) {
    // An activity's task token is long and of no use in a log; core lines carry empty span lists.
    if (v === undefined || k === 'taskToken' || (k === 'spanContexts' && Array.isArray(v) && v.length === 0)) continue;
    const key = RENAMED[k] ?? k;
    out[OWN.has(key) ? `meta_${key}` : key] = v;
  }
  const { workflowId: id, workflowType: type } = meta;
  if (typeof id === 'string' && typeof type === 'string' && RUN_WORKFLOWS.has(type)) {
    out.run ??= id.split('/')[0];
    if (type === 'checkpointAttempt') out.checkpoint_id ??= after(id, '/checkpoint/');
    if (type === 'rolloutAttempt') out.capture_key ??= after(id, '/rollout/');
  }
  out.msg = entry.message;
  return out;
}

/**
 * JSON of anything a log call passes: errors as pino's `{type, message, stack}` with their own fields
 * and cause (a Temporal failure's `type`, e.g. `gym_transient`, as `failureType`; its raw proto
 * left out), bigints as strings.
 */
export function toJson(value: unknown): string {
  const seen = new WeakSet<object>();
  return JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v === 'bigint') return v.toString();
    if (v instanceof Error) {
      const { name, message, stack, cause, type, failure: _proto, ...rest } = v as Error & { cause?: unknown; type?: unknown; failure?: unknown };
      return { type: name, message, stack, ...(type !== undefined ? { failureType: type } : {}), ...rest, ...(cause !== undefined ? { cause } : {}) };
    }
    if (typeof v === 'object' && v !== null) {
      if (seen.has(v)) return '[Circular]';
      seen.add(v);
    }
    return v;
  });
}

/** The SDK's logger with one JSON object per line (`write`: stderr). */
export class JsonLogger extends DefaultLogger {
  constructor(level: LogLevel = 'INFO', write: (line: string) => void = (line) => process.stderr.write(line)) {
    super(level, (entry) => write(`${toJson(logRecord(entry))}\n`));
  }
}

/** Where the worker's own lines go: JSON lines when the JSON logger is on, else plain (info on stdout, the rest on stderr). */
export interface WorkerLines {
  info(msg: string, meta?: LogMetadata): void;
  warn(msg: string, meta?: LogMetadata): void;
  error(msg: string, meta?: LogMetadata): void;
}

export function workerLines(format: LogFormat): WorkerLines {
  if (format === 'json') {
    const logger = new JsonLogger();
    return { info: (m, meta) => logger.info(m, meta), warn: (m, meta) => logger.warn(m, meta), error: (m, meta) => logger.error(m, meta) };
  }
  return { info: (m) => console.log(m), warn: (m) => console.error(m), error: (m) => console.error(m) };
}

function runtimeOptions(t: WorkerTelemetry): RuntimeOptions {
  const json = t.logFormat === 'json';
  return {
    ...(json ? { logger: new JsonLogger() } : {}),
    telemetryOptions: {
      // Core's own lines (WARN and up, as by default) through the same logger.
      ...(json ? { logging: { filter: { core: 'WARN', other: 'ERROR' }, forward: {} } } : {}),
      ...(t.metricsAddress
        ? {
            metrics: {
              prometheus: {
                bindAddress: t.metricsAddress,
                histogramBucketOverrides: { [METRICS.checkpointStageSeconds]: SECONDS_BUCKETS, [METRICS.gymParticipantSeconds]: SECONDS_BUCKETS },
              },
            },
          }
        : {}),
    },
  };
}

/** The Prometheus address of the Runtime's options, if any. */
function metricsAddressOf(o: RuntimeOptions): string | undefined {
  const m = o.telemetryOptions?.metrics;
  return m && 'prometheus' in m ? m.prometheus.bindAddress : undefined;
}

/**
 * Installs the process's Runtime with the metrics endpoint and the log format asked for, before any
 * connection. Nothing asked: the SDK creates its default Runtime on the first connection. A
 * Runtime already there (an earlier connection, or a test's) is kept if it serves what is asked,
 * else this throws: the SDK installs a Runtime only once per process.
 */
export function installWorkerRuntime(t: WorkerTelemetry): void {
  const json = t.logFormat === 'json';
  if (!t.metricsAddress && !json) return;
  if (Runtime._instance === undefined) {
    try {
      Runtime.install(runtimeOptions(t));
    } catch (err) {
      if (!t.metricsAddress) throw err;
      throw new Error(`worker: cannot serve metrics on ${t.metricsAddress}: ${(err as Error).message}`);
    }
    return;
  }
  const have = Runtime.defaultOptions;
  const missing: string[] = [];
  if (t.metricsAddress && metricsAddressOf(have) !== t.metricsAddress)
    missing.push(`metrics on ${t.metricsAddress} (it has ${metricsAddressOf(have) ?? 'none'})`);
  if (json && !(have.logger instanceof JsonLogger)) missing.push('JSON logs');
  if (missing.length > 0)
    throw new Error(
      `worker: this process's Temporal Runtime already exists without ${missing.join(' and ')}; ` +
        'the SDK installs one Runtime per process, before the first connection: create the workers before any other connection',
    );
}

// --- tracing -------------------------------------------------------------------------------------

/** The workflow interceptors of a tracing worker: bundled into the workflow code (worker.ts bundleWorkflows). */
export const TRACING_INTERCEPTORS_PATH = fileURLToPath(new URL('./workflows/tracing-interceptors.ts', import.meta.url));

/** Whether a workflow bundle was built with the tracing interceptors (its module IDs name the file). */
export function bundleTraces(bundle: { code: string }): boolean {
  return bundle.code.includes('/workflows/tracing-interceptors.ts"');
}

/**
 * What a Worker needs to trace, besides a bundle with the tracing interceptors: a span per activity
 * (a child of the workflow's span that scheduled it, and the active context while it runs, so its
 * HTTP calls carry it), trace IDs on activity log lines, and the sink the workflows' spans leave the
 * isolate through. Those spans carry the workflow's IDs and type, not all of its info (the SDK's
 * sink would copy in memo and search attributes as well).
 */
export function tracingWorkerOptions(tracing: Tracing): Pick<WorkerOptions, 'interceptors' | 'sinks'> {
  const sdkSink = makeWorkflowExporter(tracing.spanProcessor, tracing.resource);
  const exporter: InjectedSink<OpenTelemetryWorkflowExporter> = {
    export: {
      fn: (info, spans) =>
        sdkSink.export.fn(
          {
            temporalWorkflowId: info.workflowId,
            run_id: info.runId,
            temporalWorkflowType: info.workflowType,
            temporalTaskQueue: info.taskQueue,
            temporalNamespace: info.namespace,
          } as never,
          spans,
        ),
      // Replayed spans were exported when they first ended.
      callDuringReplay: false,
    },
  };
  return {
    interceptors: {
      activity: [(ctx) => ({ inbound: new OpenTelemetryActivityInboundInterceptor(ctx), outbound: new OpenTelemetryActivityOutboundInterceptor(ctx) })],
    },
    sinks: { exporter },
  };
}
