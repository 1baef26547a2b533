// The controller's workflows on the time-skipping test server with a real Worker and fake
// activities that throw the real error types.
import { randomUUID } from 'node:crypto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { WorkflowFailedError } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RunConfigSchema, type RunConfig } from '../../protocol/run-config.js';
import { bundleWorkflows } from '../../worker.js';
import { checkpointNow, runStatus } from '../../workflows/messages.js';
import { trainingRun } from '../../workflows/trainingRun.js';
import { createTimeSkippingEnv } from '../helpers/temporal.js';
import { FakeGym } from './fake-gym.js';

let env: TestWorkflowEnvironment;
let bundle: WorkflowBundleWithSourceMap;

beforeAll(async () => {
  env = await createTimeSkippingEnv();
  bundle = await bundleWorkflows();
});
afterAll(async () => {
  await env?.teardown();
});

function config(overrides: Record<string, unknown> = {}, tq = `tq-${randomUUID()}`): RunConfig {
  const base = {
    run: { name: `run-${randomUUID().slice(0, 8)}`, gym_run_dir: '/nonexistent', checkpoint_dir: '/tmp/ckpt', task_queue: tq, rollout_task_queue: tq },
    grpo: { num_prompts_per_step: 1, num_generations_per_prompt: 2, max_num_steps: 2, tasksets: ['counter'] },
    ...overrides,
  };
  return RunConfigSchema.parse(base);
}

async function withWorker<T>(gym: FakeGym, cfg: RunConfig, fn: () => Promise<T>): Promise<T> {
  const worker = await Worker.create({
    connection: env.nativeConnection,
    taskQueue: cfg.run.task_queue,
    workflowBundle: bundle,
    activities: gym.activities(),
  });
  return worker.runUntil(fn());
}

describe('training run', () => {
  it('runs every rollout exactly once, and a manual checkpoint is prepare → commit → cut → publish → resume', async () => {
    const gym = new FakeGym();
    gym.script.holdRuns = true;
    const cfg = config();
    await withWorker(gym, cfg, async () => {
      const handle = await env.client.workflow.start(trainingRun, { workflowId: cfg.run.name, taskQueue: cfg.run.task_queue, args: [{ config: cfg }] });
      // wait until the first two rollouts are in flight
      while (gym.running.size < 2) await new Promise((r) => setTimeout(r, 50));
      const outcome = await handle.executeUpdate(checkpointNow);
      expect(outcome).toMatchObject({ outcome: 'completed', reason: 'completed', trigger: 'manual' });
      expect(outcome.scope?.sort()).toEqual([...gym.running].sort());
      const id = outcome.checkpointId;
      const order = gym.calls.filter((c) => !c.startsWith('run:') && c !== 'discover');
      expect(order).toEqual([`allocate:1`, `prepare:${id}`, `commit:${id}`, 'ledger-cut', 'manifest', 'validate', 'publish:1', 'retention', `resume:${id}`]);
      gym.finishAll();
      // the second step's rollouts
      while (gym.count('run:') < 4) await new Promise((r) => setTimeout(r, 50));
      gym.finishAll();
      const summary = await handle.result();
      expect(summary.steps).toBe(2);
      expect(summary.completedRollouts).toBe(4);
      const runs = gym.calls.filter((c) => c.startsWith('run:'));
      expect(new Set(runs).size).toBe(runs.length);
      expect(gym.metrics.map((m) => m.outcome)).toEqual(['completed']);
    });
  });
});

void WorkflowFailedError;
void runStatus;
