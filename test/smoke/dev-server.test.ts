import { randomUUID } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from '@temporalio/worker';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createLocalEnv, type LocalEnv } from '../helpers/temporal.js';
import * as activities from './activities.js';
import { greetOnce } from './workflows.js';

let local: LocalEnv | undefined;

beforeAll(async () => {
  local = await createLocalEnv();
});

afterAll(async () => {
  await local?.teardown();
});

test('a workflow that calls one activity completes on the dev server', async () => {
  const { env } = local!;
  const taskQueue = `smoke-${randomUUID()}`;
  const worker = await Worker.create({
    connection: env.nativeConnection,
    namespace: env.namespace ?? 'default',
    taskQueue,
    workflowsPath: fileURLToPath(new URL('./workflows.ts', import.meta.url)),
    activities,
  });
  const result = await worker.runUntil(env.client.workflow.execute(greetOnce, { taskQueue, workflowId: `greet-${randomUUID()}`, args: ['Gym'] }));
  expect(result).toBe('Hello, Gym!');
});

test('a start whose CLI lost a port race starts again and serves', async () => {
  const { freePort, startDevServer } = await import('../../scripts/temporal-dev.mjs');
  const { readTemporalPaths } = await import('../../scripts/temporal-paths.mjs');
  const dir = mkdtempSync(join(tmpdir(), 'dev-race-'));
  // The first start fails the way the CLI does when a port it picked was taken before it bound it.
  const cli = join(dir, 'temporal');
  writeFileSync(
    cli,
    `#!/bin/sh\nif [ ! -e "${dir}/raced" ]; then touch "${dir}/raced"; echo 'failed listening for HTTP API on 127.0.0.1:1: listen tcp 127.0.0.1:1: bind: address already in use'; exit 1; fi\nexec "${readTemporalPaths().cli.path}" "$@"\n`,
  );
  chmodSync(cli, 0o755);
  const server = await startDevServer({ port: await freePort(), headless: true, dbFile: null, cliPath: cli, logFile: join(dir, 'log') });
  try {
    expect(existsSync(join(dir, 'raced'))).toBe(true);
    expect(readFileSync(join(dir, 'log'), 'utf8')).toContain('address already in use');
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
