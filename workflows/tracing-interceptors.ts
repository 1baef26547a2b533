// The workflows' tracing (docs/controller.md "Tracing"): bundled into the workflow code only when the
// worker traces (worker.ts, `bundleWorkflows(log, { tracing: true })`); no workflow imports it.
// The spans, names and headers of the SDK's OpenTelemetry workflow interceptors (so its activity
// interceptor continues them), made so that tracing never changes what a workflow does: a history
// recorded with tracing off replays with it on, and the other way round (test/tracing/).
//  - No await of its own: each traced call returns the very promise of the call, so workflow code
//    resumes exactly when it would untraced. The SDK's interceptors await inside, and those extra
//    microtask turns reorder commands of concurrent handlers (a shard's signal and an update's
//    completion: a nondeterminism error on the gym-crash history).
//  - Span and trace IDs come from a generator of the run's own, seeded by its run ID. The SDK's
//    draw from Math.random, which the workflows share (uuid4() for checkpoint IDs, the deadline
//    clock's ticks): tracing would change those numbers.
//  - Queries and update validators get no span: they are not replayed, so a span there would give
//    every later span of the run other IDs on replay than it had when it was first exported.
//  - A checkpoint attempt and a rollout attempt each start a trace of their own, linked to the span
//    that started them: one checkpoint is one trace (workflow, activities, Gym servers), not a
//    branch of a trace as long as the run.
// One cost of returning the call's own promise: a traced call whose rejection the workflow never
// handles no longer fails the workflow task as an unhandled rejection (the span handled it).
import '@temporalio/interceptors-opentelemetry/lib/workflow/runtime.js';
import { context, SpanStatusCode, trace, type Attributes, type Context, type Span, type SpanOptions, type Tracer } from '@opentelemetry/api';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { extractContextFromHeaders, headersWithContext, UPDATE_ID_ATTR_KEY } from '@temporalio/interceptors-opentelemetry/lib/instrumentation.js';
import { ContextManager } from '@temporalio/interceptors-opentelemetry/lib/workflow/context-manager.js';
import { SPAN_DELIMITER, SpanName } from '@temporalio/interceptors-opentelemetry/lib/workflow/definitions.js';
import { SpanExporter } from '@temporalio/interceptors-opentelemetry/lib/workflow/span-exporter.js';
import {
  ContinueAsNew,
  workflowInfo,
  type ActivityInput,
  type ContinueAsNewInput,
  type DisposeInput,
  type GetLogAttributesInput,
  type LocalActivityInput,
  type Next,
  type SignalInput,
  type SignalWorkflowInput,
  type StartChildWorkflowExecutionInput,
  type UpdateInput,
  type WorkflowExecuteInput,
  type WorkflowInboundCallsInterceptor,
  type WorkflowInterceptors,
  type WorkflowInternalsInterceptor,
  type WorkflowOutboundCallsInterceptor,
} from '@temporalio/workflow';
import { alea, type RNG } from '@temporalio/workflow/lib/alea.js';

/** Workflow types whose run is the root of its own trace. */
const OWN_TRACE_TYPES = new Set(['checkpointAttempt', 'rolloutAttempt']);

/** Trace and span IDs from this run's own generator (OpenTelemetry's IdGenerator). */
class RunIdGenerator {
  private random: RNG | undefined;

  generateTraceId(): string {
    return this.hex(4);
  }

  generateSpanId(): string {
    return this.hex(2);
  }

  private hex(words: number): string {
    // Seeded on first use (inside the workflow, where its info exists); the run ID is the same on every replay.
    this.random ??= alea([...`otel-ids:${workflowInfo().runId}`].map((c) => c.charCodeAt(0)));
    let out = '';
    for (let i = 0; i < words; i++)
      out += Math.floor(this.random() * 0x1_0000_0000)
        .toString(16)
        .padStart(8, '0');
    return out;
  }
}

// Module state is per workflow (the SDK evaluates the bundle's modules for each one): one provider
// per workflow, its spans leaving the isolate through the worker's `exporter` sink.
let contextManager: ContextManager | undefined;
let workflowTracer: Tracer | undefined;
/** The context of the workflow's own span: the parent of signals and updates that bring none. */
let runContext: Context | undefined;

function tracer(): Tracer {
  if (workflowTracer) return workflowTracer;
  contextManager = new ContextManager();
  const provider = new BasicTracerProvider({ idGenerator: new RunIdGenerator(), spanProcessors: [new SimpleSpanProcessor(new SpanExporter())] });
  provider.register({ contextManager });
  workflowTracer = provider.getTracer('rollout-checkpoint/workflow');
  return workflowTracer;
}

function failed(span: Span, err: unknown): void {
  span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
  span.recordException(err instanceof Error ? err : String(err));
}

const isContinueAsNew = (err: unknown): boolean => err instanceof ContinueAsNew;

/**
 * Runs `call` in a span, active while it runs (so the calls it makes carry it), ended when the
 * promise settles; returns `call`'s own promise (see the top of the file for why).
 */
function traced<T>(name: string, options: SpanOptions, parent: Context, call: () => Promise<T>, benign?: (err: unknown) => boolean): Promise<T> {
  return tracer().startActiveSpan(name, options, parent, (span) => {
    let result: Promise<T>;
    try {
      result = call();
    } catch (err) {
      failed(span, err);
      span.end();
      throw err;
    }
    result.then(
      () => {
        span.setStatus({ code: SpanStatusCode.OK });
        span.end();
      },
      (err: unknown) => {
        if (benign?.(err)) span.setStatus({ code: SpanStatusCode.OK });
        else failed(span, err);
        span.end();
      },
    );
    return result;
  });
}

/** The run, and the checkpoint ID or capture key, from an attempt's workflow ID (`<run>/checkpoint/<id>`, `<run>/rollout/<key>`). */
function attemptAttributes(workflowId: string): Attributes {
  const [run, what, ...rest] = workflowId.split('/');
  const id = rest.join('/');
  if (what === 'checkpoint') return { run, checkpoint_id: id };
  if (what === 'rollout') return { run, capture_key: id };
  return { run };
}

const spanName = (kind: SpanName, what: string): string => `${kind}${SPAN_DELIMITER}${what}`;

class TracingInbound implements WorkflowInboundCallsInterceptor {
  execute(input: WorkflowExecuteInput, next: Next<WorkflowInboundCallsInterceptor, 'execute'>): Promise<unknown> {
    const info = workflowInfo();
    const name = spanName(SpanName.WORKFLOW_EXECUTE, info.workflowType);
    const starter = extractContextFromHeaders(input.headers);
    const run = (): Promise<unknown> => {
      runContext = context.active();
      return next(input);
    };
    if (!OWN_TRACE_TYPES.has(info.workflowType)) return traced(name, {}, starter ?? context.active(), run, isContinueAsNew);
    const starterSpan = starter ? trace.getSpanContext(starter) : undefined;
    const options: SpanOptions = { root: true, links: starterSpan ? [{ context: starterSpan }] : [], attributes: attemptAttributes(info.workflowId) };
    return traced(name, options, context.active(), run, isContinueAsNew);
  }

  // A signal or update from a caller that does not trace (a client, or a server that drops the
  // header) is part of the workflow's trace rather than a one-span trace of its own.
  handleSignal(input: SignalInput, next: Next<WorkflowInboundCallsInterceptor, 'handleSignal'>): Promise<void> {
    const parent = extractContextFromHeaders(input.headers) ?? runContext ?? context.active();
    return traced(spanName(SpanName.WORKFLOW_HANDLE_SIGNAL, input.signalName), {}, parent, () => next(input));
  }

  handleUpdate(input: UpdateInput, next: Next<WorkflowInboundCallsInterceptor, 'handleUpdate'>): Promise<unknown> {
    const parent = extractContextFromHeaders(input.headers) ?? runContext ?? context.active();
    const options = { attributes: { [UPDATE_ID_ATTR_KEY]: input.updateId } };
    return traced(spanName(SpanName.WORKFLOW_HANDLE_UPDATE, input.name), options, parent, () => next(input));
  }
}

class TracingOutbound implements WorkflowOutboundCallsInterceptor {
  scheduleActivity(input: ActivityInput, next: Next<WorkflowOutboundCallsInterceptor, 'scheduleActivity'>): Promise<unknown> {
    return traced(spanName(SpanName.ACTIVITY_START, input.activityType), {}, context.active(), () =>
      next({ ...input, headers: headersWithContext(input.headers) }),
    );
  }

  scheduleLocalActivity(input: LocalActivityInput, next: Next<WorkflowOutboundCallsInterceptor, 'scheduleLocalActivity'>): Promise<unknown> {
    return traced(spanName(SpanName.ACTIVITY_START, input.activityType), {}, context.active(), () =>
      next({ ...input, headers: headersWithContext(input.headers) }),
    );
  }

  startChildWorkflowExecution(
    input: StartChildWorkflowExecutionInput,
    next: Next<WorkflowOutboundCallsInterceptor, 'startChildWorkflowExecution'>,
  ): Promise<[Promise<string>, Promise<unknown>]> {
    return traced(spanName(SpanName.CHILD_WORKFLOW_START, input.workflowType), {}, context.active(), () =>
      next({ ...input, headers: headersWithContext(input.headers) }),
    );
  }

  continueAsNew(input: ContinueAsNewInput, next: Next<WorkflowOutboundCallsInterceptor, 'continueAsNew'>): Promise<never> {
    return traced(
      spanName(SpanName.CONTINUE_AS_NEW, input.options.workflowType),
      {},
      context.active(),
      () => next({ ...input, headers: headersWithContext(input.headers) }),
      isContinueAsNew,
    );
  }

  signalWorkflow(input: SignalWorkflowInput, next: Next<WorkflowOutboundCallsInterceptor, 'signalWorkflow'>): Promise<void> {
    return traced(spanName(SpanName.WORKFLOW_SIGNAL, input.signalName), {}, context.active(), () =>
      next({ ...input, headers: headersWithContext(input.headers) }),
    );
  }

  /** The active span's IDs on the workflow's log lines (as the SDK's interceptor adds them). */
  getLogAttributes(input: GetLogAttributesInput, next: Next<WorkflowOutboundCallsInterceptor, 'getLogAttributes'>): Record<string, unknown> {
    const span = trace.getSpan(context.active())?.spanContext();
    if (!span || !trace.isSpanContextValid(span)) return next(input);
    return next({ trace_id: span.traceId, span_id: span.spanId, trace_flags: `0${span.traceFlags.toString(16)}`, ...input });
  }
}

class TracingInternals implements WorkflowInternalsInterceptor {
  dispose(input: DisposeInput, next: Next<WorkflowInternalsInterceptor, 'dispose'>): void {
    contextManager?.disable();
    next(input);
  }
}

export const interceptors = (): WorkflowInterceptors => {
  tracer();
  return { inbound: [new TracingInbound()], outbound: [new TracingOutbound()], internals: [new TracingInternals()] };
};
