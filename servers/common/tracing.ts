// OpenTelemetry tracing of the worker and the Gym servers (docs/controller.md "Tracing"). Off unless
// an OTLP endpoint is configured (or a test passes an exporter): then one tracer provider per
// process, the W3C trace context on every HTTP call into a participant, and a server span per
// control route and per `/run`. Off, none of the SDK is even loaded and the API stays its no-ops.
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Attributes, type Span } from '@opentelemetry/api';
import type { Resource } from '@opentelemetry/resources';
import type { SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { CONTROL_PREFIX } from '../../protocol/control.js';

/** The standard variable, read by the worker (unless `--otlp-endpoint` is given) and by every Gym server. */
export const OTLP_ENDPOINT_ENV = 'OTEL_EXPORTER_OTLP_ENDPOINT';

export interface TracingOptions {
  /** The resource's `service.name`: `rollout-controller` for the worker, the server's name for a Gym server. */
  serviceName: string;
  /** OTLP/HTTP base URL (spans go to `<endpoint>/v1/traces`), e.g. `http://127.0.0.1:4318`. */
  otlpEndpoint?: string | undefined;
  /** Tests: every span to this exporter as it ends (e.g. an InMemorySpanExporter) instead of OTLP. */
  exporter?: SpanExporter | undefined;
  resourceAttributes?: Attributes;
}

export interface Tracing {
  readonly resource: Resource;
  /** Where ended spans go; the worker hands the workflows' spans to it too. */
  readonly spanProcessor: SpanProcessor;
  /** Exports every ended span now. */
  flush(): Promise<void>;
  /** Flushes and unregisters the provider: tracing is off again in this process. */
  shutdown(): Promise<void>;
}

let current: Tracing | undefined;

/** Whether this process traces (startTracing ran and was not shut down). */
export function tracingOn(): boolean {
  return current !== undefined;
}

/** The traces URL of an OTLP/HTTP endpoint; throws, saying why, for anything but an http(s) URL. */
export function otlpTracesUrl(endpoint: string): string {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new Error(`the OTLP endpoint must be an http(s) URL such as http://127.0.0.1:4318, not '${endpoint}'`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`the OTLP endpoint must be an http(s) URL, not '${endpoint}'`);
  // The OTLP spec's base-URL rule: the signal's path is appended (a full traces URL is kept as given).
  const base = endpoint.replace(/\/+$/, '');
  return base.endsWith('/v1/traces') ? base : `${base}/v1/traces`;
}

/**
 * Starts tracing for this process when an endpoint or an exporter is given; undefined (tracing off)
 * otherwise. The SDK is imported here, so a process that does not trace never loads it.
 */
export async function startTracing(opts: TracingOptions): Promise<Tracing | undefined> {
  const endpoint = opts.otlpEndpoint?.trim() || undefined;
  if (!opts.exporter && !endpoint) return undefined;
  if (current) throw new Error('tracing is already on in this process (one tracer provider per process)');
  const tracesUrl = endpoint && !opts.exporter ? otlpTracesUrl(endpoint) : undefined;
  const [{ NodeTracerProvider }, { BatchSpanProcessor, SimpleSpanProcessor }, { Resource }, { W3CTraceContextPropagator }] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/sdk-trace-base'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/core'),
  ]);
  let spanProcessor: SpanProcessor;
  if (opts.exporter) spanProcessor = new SimpleSpanProcessor(opts.exporter);
  else {
    const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-http');
    spanProcessor = new BatchSpanProcessor(new OTLPTraceExporter({ url: tracesUrl }));
  }
  const resource = new Resource({ ...opts.resourceAttributes, 'service.name': opts.serviceName });
  const provider = new NodeTracerProvider({ resource, spanProcessors: [spanProcessor] });
  // The default context manager (AsyncLocalStorage) carries the active span across awaits; only
  // the W3C trace context goes on the wire (no baggage).
  provider.register({ propagator: new W3CTraceContextPropagator() });
  const tracing: Tracing = {
    resource,
    spanProcessor,
    flush: () => provider.forceFlush(),
    async shutdown() {
      if (current !== tracing) return;
      current = undefined;
      try {
        await provider.shutdown();
      } finally {
        trace.disable();
        propagation.disable();
        context.disable();
      }
    },
  };
  current = tracing;
  return tracing;
}

const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

/** The active context's `traceparent` (and `tracestate`) for an outgoing call; none when tracing is off. */
export function traceHeaders(): Readonly<Record<string, string>> {
  if (!current) return NO_HEADERS;
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return carrier;
}

// --- the Gym servers' spans ----------------------------------------------------------------------

const SPAN = Symbol('gymServerSpan');
type WithSpan = FastifyRequest & { [SPAN]?: Span };

/** `gym.control.<operation>` for a control route, `gym.run` for `/run`; undefined for the routes not traced. */
export function serverSpanName(route: string | undefined): string | undefined {
  if (route === undefined) return undefined;
  if (route === '/run') return 'gym.run';
  if (route.startsWith(`${CONTROL_PREFIX}/`)) return `gym.control.${route.slice(CONTROL_PREFIX.length + 1)}`;
  return undefined;
}

/**
 * A server span per control call and per `/run`, a child of the caller's `traceparent` (or a root
 * without one), ended when the connection is done with the reply. createGymApp adds it when the
 * process traces; the other routes (the data plane, `/metrics`, `/healthz`) get nothing.
 */
export function traceGymRequests(app: FastifyInstance, server: { name: string; kind: string }): void {
  const tracer = trace.getTracer('rollout-checkpoint/gym');
  app.addHook('onRequest', (req, reply, done) => {
    const route = req.routeOptions.url;
    const name = serverSpanName(route);
    if (name === undefined) return done();
    const parent = propagation.extract(ROOT_CONTEXT, req.headers);
    const span = tracer.startSpan(
      name,
      {
        kind: SpanKind.SERVER,
        attributes: { 'gym.server': server.name, 'gym.kind': server.kind, 'http.request.method': req.method, 'http.route': route! },
      },
      parent,
    );
    (req as WithSpan)[SPAN] = span;
    // 'close' comes after the reply was sent, and also when the caller went away first (a cancelled `/run`).
    reply.raw.once('close', () => {
      span.setAttribute('http.response.status_code', reply.statusCode);
      if (!reply.raw.writableEnded) span.setStatus({ code: SpanStatusCode.ERROR, message: 'connection closed before the reply was sent' });
      else if (reply.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
    });
    done();
  });
  // The body is parsed by now: a `/run` names its episode. The handler runs in the span's context.
  app.addHook('preHandler', (req, _reply, done) => {
    const span = (req as WithSpan)[SPAN];
    if (!span) return done();
    const episode = (req.body as { episode_id?: { rollout_id?: unknown; attempt?: unknown } } | undefined)?.episode_id;
    if (typeof episode?.rollout_id === 'string') span.setAttribute('rollout_id', episode.rollout_id);
    if (typeof episode?.attempt === 'number') span.setAttribute('attempt', episode.attempt);
    context.with(trace.setSpan(context.active(), span), done);
  });
}

/** Adds attributes to the request's server span, if it has one (IDs and codes only: never a body or a token). */
export function annotateRequestSpan(req: FastifyRequest, attributes: Attributes): void {
  (req as WithSpan)[SPAN]?.setAttributes(attributes);
}
