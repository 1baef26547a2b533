// One Gym server process: `tsx servers/main.ts --deployment <yaml> --name <server> --endpoints <json>`.
// The launcher starts one per server (each its own process group); tests may too.
// OTEL_EXPORTER_OTLP_ENDPOINT set: traces its control calls and `/run`s (servers/common/tracing.ts).
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { ConfigError, parseConfig } from './common/config-error.js';
import { EndpointsSchema, loadDeployment, sessionSecretOf } from './common/deployment.js';
import { closeDataAgent } from './common/http-client.js';
import type { ServerContext } from './common/server-context.js';
import { OTLP_ENDPOINT_ENV, otlpTracesUrl, startTracing } from './common/tracing.js';
import { loadServerModule } from './registry.js';

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { deployment: { type: 'string' }, name: { type: 'string' }, endpoints: { type: 'string' } },
  });
  if (!values.deployment || !values.name || !values.endpoints) {
    throw new ConfigError('(arguments)', 'usage: servers/main.ts --deployment <yaml> --name <server> --endpoints <json>');
  }
  const deployment = loadDeployment(values.deployment);
  const entry = deployment.servers[values.name];
  if (!entry) throw new ConfigError(`servers.${values.name}`, 'no such server in the deployment');
  const endpoints = parseConfig(EndpointsSchema, JSON.parse(readFileSync(values.endpoints, 'utf8')), 'endpoints');
  const me = endpoints[values.name];
  if (!me) throw new ConfigError(`endpoints.${values.name}`, 'no endpoint for this server');
  const otlpEndpoint = process.env[OTLP_ENDPOINT_ENV] || undefined;
  if (otlpEndpoint !== undefined) {
    try {
      otlpTracesUrl(otlpEndpoint);
    } catch (err) {
      throw new ConfigError(OTLP_ENDPOINT_ENV, (err as Error).message);
    }
  }
  // Before the app is built: createGymApp adds the tracing hooks only in a process that traces.
  const tracing = await startTracing({ serviceName: values.name, otlpEndpoint, resourceAttributes: { 'gym.kind': entry.kind } });
  const mod = await loadServerModule(values.name, entry);
  const options = parseConfig(mod.optionsSchema, entry.options, `servers.${values.name}.options`);
  const ctx: ServerContext = {
    name: values.name,
    entry,
    deployment,
    endpoints,
    checkpoint: deployment.checkpoint,
    sessionSecret: sessionSecretOf(deployment),
    logLevel: process.env.LOG_LEVEL ?? 'info',
  };
  const app = await mod.build(ctx, options);
  const port = Number(new URL(me.url).port);
  await app.listen({ host: '127.0.0.1', port });
  app.log.info({ url: me.url }, 'listening');
  const shutdown = (): void => {
    void app
      .close()
      .then(closeDataAgent)
      .then(() => tracing?.shutdown())
      .finally(() => process.exit(0));
  };
  process.once('SIGTERM', shutdown);
  process.once('SIGINT', shutdown);
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) {
    console.error(`config error: ${err.message}`);
    process.exit(2);
  }
  console.error(err);
  process.exit(1);
});
