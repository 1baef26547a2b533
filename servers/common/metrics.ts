// Prometheus metrics of one Gym server (docs/gym-servers.md "Metrics"), served at `GET /metrics`
// outside the control routes' prefix, so without the control token. One registry per server
// instance: tests run several servers in one process. Label values come from fixed sets only
// (phases, operations, the codes of protocol/errors.ts): never episode, capture or checkpoint IDs.
import type { FastifyInstance, FastifyReply } from 'fastify';
import { AggregatorRegistry, Counter, collectDefaultMetrics, Gauge, Histogram, type MetricObjectWithValues, type MetricValue, Registry } from 'prom-client';
import { PHASES } from '../../protocol/control.js';
import { ERROR_CODES, type ErrorCode, type ProtocolError } from '../../protocol/errors.js';
import { SECONDS_BUCKETS } from '../../protocol/metric-buckets.js';
import type { ControlPlane } from '../control/control-plane.js';
import type { ReadinessReport } from '../control/hooks.js';
import { workerRole } from '../control/storage/worker-role.js';
import { annotateRequestSpan } from './tracing.js';

const DECORATOR = 'gymMetrics';

/** The control calls whose duration is observed. */
export type TimedOperation = 'prepare' | 'commit' | 'restore' | 'resume';
const TIMED_OPERATIONS: readonly TimedOperation[] = ['prepare', 'commit', 'restore', 'resume'];

const ADMISSION_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600];

export class GymMetrics {
  readonly registry = new Registry();
  private readonly refusals: Counter<'code'>;
  private defaultsPending: boolean;

  constructor(opts: { processMetrics?: boolean } = {}) {
    this.defaultsPending = opts.processMetrics ?? true;
    this.refusals = new Counter({
      name: 'gym_refusals_total',
      help: 'Typed error envelopes sent, by error code.',
      labelNames: ['code'],
      registers: [this.registry],
    });
    // Every code from the start, so a rate over a first refusal is not lost.
    for (const code of ERROR_CODES) this.refusals.inc({ code }, 0);
  }

  refused(code: ErrorCode): void {
    this.refusals.inc({ code });
  }

  /** The metrics of this server's control plane (one per server). */
  control(plane: ControlPlane): ControlMetrics {
    return new ControlMetrics(this.registry, plane);
  }

  async scrape(): Promise<string> {
    this.startDefaults();
    return this.registry.metrics();
  }

  /** The metrics as prom-client's JSON, for a multi-worker server's front to add up. */
  async scrapeJson(): Promise<MetricObjectWithValues<MetricValue<string>>[]> {
    this.startDefaults();
    return this.registry.getMetricsAsJSON();
  }

  private startDefaults(): void {
    if (this.defaultsPending) {
      // On the first scrape only: a server nobody scrapes (most test servers) starts no GC
      // observer or event-loop monitor, which prom-client never stops.
      this.defaultsPending = false;
      collectDefaultMetrics({ register: this.registry });
    }
  }
}

/** What the control plane records; the gauges read the plane and its participant at scrape time. */
export class ControlMetrics {
  private readonly durations: Histogram<'operation'>;
  private readonly admissionClosed: Histogram;
  private readonly exported: Counter;
  private readonly restored: Counter;

  constructor(registry: Registry, plane: ControlPlane) {
    const registers = [registry];
    new Gauge({
      name: 'gym_control_phase',
      help: 'Control plane phase: 1 for the current one, 0 for the others.',
      labelNames: ['phase'],
      registers,
      // A multi-worker server's workers move through the phases together: 1 where any worker is.
      aggregator: 'max',
      collect() {
        for (const phase of PHASES) this.set({ phase }, phase === plane.currentPhase ? 1 : 0);
      },
    });
    this.durations = new Histogram({
      name: 'gym_control_operation_duration_seconds',
      help: 'Duration of control calls that did work (replays and fencing refusals excluded).',
      labelNames: ['operation'],
      buckets: SECONDS_BUCKETS,
      registers,
    });
    for (const operation of TIMED_OPERATIONS) this.durations.zero({ operation });
    this.admissionClosed = new Histogram({
      name: 'gym_admission_closed_seconds',
      help: 'Time from closing admission (prepare or restore) to reopening it.',
      buckets: ADMISSION_BUCKETS,
      registers,
    });
    this.exported = new Counter({ name: 'gym_records_exported_total', help: 'Checkpoint records written by commits.', registers });
    this.restored = new Counter({ name: 'gym_records_restored_total', help: 'Checkpoint records installed by restores.', registers });

    // The counts each kind already reports (control-plane.md §10), read when scraped.
    const gauge = (name: string, help: string, read: (r: ReadinessReport) => number | undefined): void => {
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read(plane.hooks.report(plane.carriedRestarts)) ?? 0);
        },
      });
    };
    const IN_FLIGHT = 'gym_episodes_in_flight';
    const PARKED = 'gym_episodes_parked';
    switch (plane.kind) {
      case 'environment':
        gauge(IN_FLIGHT, 'Episodes in flight: the episodes this environment runs.', (r) => r.counts.episodes);
        gauge(PARKED, 'Parked episodes: at a committable boundary (neither blocking a checkpoint nor restarts).', (r) =>
          Math.max(0, (r.counts.episodes ?? 0) - size(r.blockers) - size(r.restarts)),
        );
        break;
      case 'agent':
        gauge(IN_FLIGHT, 'Episodes in flight: agent sessions (restart-only agent: calls in flight).', (r) => r.counts.sessions ?? r.counts.inflight);
        gauge(PARKED, 'Parked episodes: agent sessions at a boundary.', (r) => r.counts.at_boundary);
        break;
      case 'resources':
        gauge(IN_FLIGHT, 'Episodes in flight: resources sessions.', (r) => r.counts.sessions);
        break;
      case 'model':
        gauge('gym_model_calls_in_flight', 'Admitted model calls not yet finished.', (r) => r.counts.inflight);
        gauge('gym_model_calls_held', 'Model call responses held until resume.', (r) => r.counts.held);
        break;
    }
  }

  operation(operation: TimedOperation, seconds: number): void {
    this.durations.observe({ operation }, seconds);
  }

  admissionReopened(closedSeconds: number): void {
    this.admissionClosed.observe(closedSeconds);
  }

  recordsExported(n: number): void {
    this.exported.inc(n);
  }

  recordsRestored(n: number): void {
    this.restored.inc(n);
  }
}

function size(items: Iterable<unknown>): number {
  return Array.isArray(items) ? items.length : [...items].length;
}

/**
 * A worker's metrics as JSON, for its front (docs/multi-worker.md). Served by workers only, and
 * never reachable through the server's URL: the front answers this prefix itself (404).
 */
export const WORKER_METRICS_PATH = '/_ng_worker/metrics';

export interface ServeMetricsOptions {
  processMetrics?: boolean;
  /** A multi-worker server's front: its workers' metrics (JSON), added to its own in one scrape. */
  workerMetrics?: () => Promise<unknown[][]>;
}

/** Gives the app its metrics and serves them at `GET /metrics`. */
export function serveMetrics(app: FastifyInstance, opts: ServeMetricsOptions = {}): GymMetrics {
  const metrics = new GymMetrics(opts);
  app.decorate(DECORATOR, metrics);
  const workers = opts.workerMetrics;
  // Scraped every few seconds: not worth two info log lines each time.
  app.get('/metrics', { logLevel: 'warn' }, async (_req, reply) => {
    if (!workers) return reply.type(metrics.registry.contentType).send(await metrics.scrape());
    // Counters and histograms add up, gauges as each metric says (prom-client's cluster aggregation).
    const [own, theirs] = await Promise.all([metrics.scrapeJson(), workers()]);
    const all = AggregatorRegistry.aggregate([own, ...theirs]);
    return reply.type(all.contentType).send(await all.metrics());
  });
  if (workerRole() !== undefined) app.get(WORKER_METRICS_PATH, { logLevel: 'warn' }, async () => metrics.scrapeJson());
  return metrics;
}

/** The metrics of the app (or a plugin context of it) made by createGymApp; undefined for other apps. */
export function metricsOf(app: FastifyInstance): GymMetrics | undefined {
  return app.hasDecorator(DECORATOR) ? app.getDecorator<GymMetrics>(DECORATOR) : undefined;
}

/**
 * A worker's answer to its front, which came on the worker's Unix socket (callers' connections,
 * handed over by the front, are TCP): the front counts the refusal it relays, once for the server.
 */
function toOwnFront(reply: FastifyReply): boolean {
  return workerRole() !== undefined && reply.request.raw.socket?.remoteFamily === undefined;
}

/**
 * Sends a typed refusal and counts it: the one way a server answers with an error envelope (the
 * error handlers use it too), so no refusal is missed and no response body is ever inspected.
 */
export function sendRefusal(reply: FastifyReply, err: ProtocolError): FastifyReply {
  if (!toOwnFront(reply)) metricsOf(reply.server)?.refused(err.code);
  annotateRequestSpan(reply.request, { 'gym.error_code': err.code });
  return reply.code(err.status).send(err.toEnvelope());
}
