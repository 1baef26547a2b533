// Temporal environments for tests. Both use binaries resolved by scripts/bootstrap.mjs
// (`existing-path`), so nothing is downloaded at test time.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Connection } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { INDEXED_VALUE_TYPE, SEARCH_ATTRIBUTES } from '../../protocol/search-attributes.mjs';
import { readTemporalPaths } from '../../scripts/temporal-paths.mjs';
import { freePort, startDevServer, type DevServer, type DevServerOptions } from '../../scripts/temporal-dev.mjs';

/** Quiet core logs; must run before the first connection, and only once per process. */
export function installTestRuntime(): void {
  if (Runtime._instance === undefined) Runtime.install({ logger: new DefaultLogger('WARN') });
}

/** The Java test server: timers fire as soon as no workflow task is pending. With the controller's search attributes registered (its operator API), as the worker does. */
export async function createTimeSkippingEnv(): Promise<TestWorkflowEnvironment> {
  installTestRuntime();
  const { path } = readTemporalPaths().testServer;
  const env = await TestWorkflowEnvironment.createTimeSkipping({ server: { executable: { type: 'existing-path', path } } });
  // Its operator API adds attributes but cannot list them.
  await env.connection.operatorService.addSearchAttributes({
    namespace: env.namespace ?? 'default',
    searchAttributes: Object.fromEntries(Object.entries(SEARCH_ATTRIBUTES).map(([name, type]) => [name, INDEXED_VALUE_TYPE[type]])),
  });
  return env;
}

export interface LocalEnv {
  env: TestWorkflowEnvironment;
  server: DevServer;
  /** Closes the connections, stops the dev server and deletes its database. */
  teardown(): Promise<void>;
}

/**
 * A real dev server started by our launcher (not the SDK's, which gives it only 5 s to come up),
 * on free ports with its own database in a temp dir.
 */
export async function createLocalEnv(options: DevServerOptions = {}): Promise<LocalEnv> {
  installTestRuntime();
  const dir = await mkdtemp(join(tmpdir(), 'temporal-test-'));
  const server = await startDevServer({
    port: await freePort(),
    headless: true,
    dbFile: join(dir, 'temporal.sqlite'),
    ...options,
  });
  let env: TestWorkflowEnvironment;
  try {
    env = await TestWorkflowEnvironment.createFromExistingServer({ address: server.address, namespace: server.namespace });
  } catch (err) {
    await server.stop();
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    env,
    server,
    async teardown() {
      try {
        await env.teardown();
      } finally {
        await server.stop();
        await rm(dir, { recursive: true, force: true });
      }
    },
  };
}

/**
 * A client connection to a dev server the test started. A connect that fails says whether the
 * server is still running and what its log ended with, and is tried again while it runs: a loaded
 * machine can keep a live server from finishing a handshake within the SDK's connect timeout.
 */
export async function connectTo(server: DevServer, tries = 3): Promise<Connection> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await Connection.connect({ address: server.address });
    } catch (err) {
      const exit = await Promise.race([server.exited, Promise.resolve(undefined)]);
      if (exit === undefined && attempt < tries) continue;
      const tail = server.logFile ? (await readFile(server.logFile, 'utf8').catch(() => '')).split('\n').slice(-20).join('\n') : '';
      const state = exit === undefined ? 'still running' : `exited (${JSON.stringify(exit)})`;
      throw new Error(`could not connect to the dev server at ${server.address} (${state}) after ${attempt} tries: ${(err as Error).message}\n${tail}`, {
        cause: err,
      });
    }
  }
}
