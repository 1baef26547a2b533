import { randomUUID } from 'node:crypto';
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
  const result = await worker.runUntil(
    env.client.workflow.execute(greetOnce, { taskQueue, workflowId: `greet-${randomUUID()}`, args: ['Gym'] }),
  );
  expect(result).toBe('Hello, Gym!');
});
