// The worker's client as an activity uses it to start or signal workflows: with the tracing
// interceptor when this process traces, so what it starts or signals links to the activity's span.
import type { Context } from '@temporalio/activity';
import { Client, type WorkflowClientInterceptor } from '@temporalio/client';
import { OpenTelemetryWorkflowClientInterceptor } from '@temporalio/interceptors-opentelemetry';
import { tracingOn } from '../servers/common/tracing.js';

/** One traced client per connection. */
const traced = new WeakMap<object, Client>();

export function activityClient(ctx: Context): Client {
  const base = ctx.client;
  if (!tracingOn()) return base;
  let client = traced.get(base.connection);
  if (!client) {
    const workflow: WorkflowClientInterceptor[] = [new OpenTelemetryWorkflowClientInterceptor()];
    client = new Client({ connection: base.connection, namespace: ctx.info.workflowNamespace, interceptors: { workflow } });
    traced.set(base.connection, client);
  }
  return client;
}
