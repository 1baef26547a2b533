import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { bundleWorkflowCode, DefaultLogger, Worker, type WorkflowBundle } from '@temporalio/worker';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTimeSkippingEnv } from '../helpers/temporal.js';
import { sleepAnHour } from './workflows.js';

let env: TestWorkflowEnvironment | undefined;
let bundle: WorkflowBundle;

beforeAll(async () => {
  env = await createTimeSkippingEnv();
  bundle = await bundleWorkflowCode({
    workflowsPath: fileURLToPath(new URL('./workflows.ts', import.meta.url)),
    logger: new DefaultLogger('WARN'), // webpack's stats are noise here
  });
});

afterAll(async () => {
  await env?.teardown();
});

test('an hour-long sleep finishes in seconds under time skipping', async () => {
  const testEnv = env!;
  const taskQueue = `smoke-${randomUUID()}`;
  const worker = await Worker.create({ connection: testEnv.nativeConnection, taskQueue, workflowBundle: bundle });
  const started = performance.now();
  const slept = await worker.runUntil(testEnv.client.workflow.execute(sleepAnHour, { taskQueue, workflowId: `sleep-${randomUUID()}` }));
  expect(slept).toBeGreaterThanOrEqual(3_600_000);
  expect(performance.now() - started).toBeLessThan(20_000);
});
