// One Gym server process: `tsx servers/main.ts --deployment <yaml> --name <server> --endpoints <json>`.
// The launcher starts one per server (each its own process group); tests may too.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { ConfigError, parseConfig } from './common/config-error.js';
import { EndpointsSchema, loadDeployment, sessionSecretOf } from './common/deployment.js';
import { closeDataAgent } from './common/http-client.js';
import type { ServerContext } from './common/server-context.js';
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
