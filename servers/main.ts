// One Gym server process: `tsx servers/main.ts --deployment <yaml> --name <server> --endpoints <json>`.
// The launcher starts one per server (each its own process group); tests may too. A server with
// `workers: N > 1` runs as a front on its URL and N workers it starts itself (`--worker i --socket
// PATH --instance-id ID`, docs/multi-worker.md).
// OTEL_EXPORTER_OTLP_ENDPOINT set: traces its control calls and `/run`s (servers/common/tracing.ts).
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { SERVER_LISTEN_BACKLOG } from '../protocol/keep-alive.js';
import { ConfigError, parseConfig } from './common/config-error.js';
import { EndpointsSchema, loadDeployment, sessionSecretOf, type Deployment, type ServerEntry } from './common/deployment.js';
import { closeDataAgent } from './common/http-client.js';
import type { ServerContext } from './common/server-context.js';
import { adoptServerInstanceId } from './control/control-plane.js';
import { setWorkerRole } from './control/storage/worker-role.js';
import { OTLP_ENDPOINT_ENV, otlpTracesUrl, startTracing } from './common/tracing.js';
import { loadServerModule } from './registry.js';
import { WorkerCoordinator } from './workers/coordinator.js';
import { buildFront } from './workers/front.js';
import { acceptHandoffs } from './workers/handoff.js';
import { announceWorkerReady, spawnWorkers, workerSocketPath } from './workers/spawn-workers.js';

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      deployment: { type: 'string' },
      name: { type: 'string' },
      endpoints: { type: 'string' },
      worker: { type: 'string' },
      socket: { type: 'string' },
      'instance-id': { type: 'string' },
    },
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
  if (entry.workers > 1 && mod.singleProcess) throw new ConfigError(`servers.${values.name}.workers`, `this server runs as one process: ${mod.singleProcess}`);
  const options = parseConfig(mod.optionsSchema, entry.options, `servers.${values.name}.options`);
  if (entry.workers > 1 && values.worker === undefined) {
    const participates = mod.participates ? mod.participates(deployment, options) : deployment.checkpoint.enabled;
    await runFront(values.name, entry, deployment, me.url, process.argv.slice(1), participates);
    return;
  }
  if (values['instance-id'] !== undefined) adoptServerInstanceId(values['instance-id']);
  if (values.worker !== undefined) setWorkerRole({ index: Number(values.worker), of: entry.workers });
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
  if (values.socket !== undefined) {
    // Its socket takes the front's control calls; callers' connections come handed over by the front.
    await app.listen({ path: values.socket });
    const socketDir = path.dirname(values.socket);
    acceptHandoffs(app.server, { index: Number(values.worker), workers: entry.workers, socketOf: (j) => workerSocketPath(socketDir, j), frontUrl: me.url });
    app.log.info({ worker: Number(values.worker), socket: values.socket }, 'worker listening');
    announceWorkerReady();
  } else {
    await app.listen({ host: '127.0.0.1', port: Number(new URL(me.url).port), backlog: SERVER_LISTEN_BACKLOG });
    app.log.info({ url: me.url }, 'listening');
  }
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

/** The front of a multi-worker server: its workers first, then the server's URL; gone when any worker is. */
async function runFront(name: string, entry: ServerEntry, deployment: Deployment, url: string, args: string[], participates: boolean): Promise<void> {
  const instanceId = randomUUID();
  const workers = await spawnWorkers({ workers: entry.workers, args, instanceId });
  // The control routes only where the workers have them (a model without checkpoint_policy has none: 404).
  const token = participates ? deployment.checkpoint.control_auth_token! : undefined;
  const coordinator = token ? new WorkerCoordinator({ kind: entry.kind, instance: name, instanceId, token, sockets: workers.sockets }) : undefined;
  const front = await buildFront({
    name,
    kind: entry.kind,
    workers: workers.processes,
    sockets: workers.sockets,
    coordinator,
    token,
    logLevel: process.env.LOG_LEVEL ?? 'info',
  });
  await front.listen(Number(new URL(url).port));
  const app = front.app;
  app.log.info({ url, workers: entry.workers }, 'listening');
  let stopping = false;
  void workers.lost.then((why) => {
    if (stopping) return;
    // One worker gone is the whole server gone: the controller sees a new instance when it is back.
    app.log.error({ why }, 'a worker exited; the server stops');
    workers.kill();
    process.exit(1);
  });
  const shutdown = (): void => {
    stopping = true;
    // The workers go first, each as a process told to stop does (it may write what it keeps on exit).
    void workers
      .stop(5_000)
      .then(() => front.close())
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
