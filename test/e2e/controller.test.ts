// The controller on the real dev server against a real Gym deployment: a training run with
// periodic checkpoints, and a worker process SIGKILLed in the middle of a checkpoint attempt.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, Connection } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { RunConfigSchema, type RunConfig } from '../../protocol/run-config.js';
import { downDeployment, upDeployment } from '../../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { startRun } from '../../scripts/run.js';
import { freePort, startDevServer, type DevServer } from '../../scripts/temporal-dev.mjs';
import { runStatus } from '../../workflows/messages.js';

const TOKEN = 'controller-e2e-token';
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const GYM_YAML = join(ROOT, 'examples/gym.yaml');

let dir: string;
let server: DevServer;
let connection: Connection;
let client: Client;
const workers: GroupProcess[] = [];

function startWorkerProcess(taskQueue: string): GroupProcess {
  const proc = spawnGroup({
    command: process.execPath,
    args: ['--import', 'tsx', join(ROOT, 'worker.ts'), '--address', server.address, '--task-queue', taskQueue, '--rollout-task-queue', `${taskQueue}-run`],
    env: { ...process.env, GYM_CONTROL_TOKEN: TOKEN },
    cwd: ROOT,
    onLine: (line) => {
      if (process.env.E2E_VERBOSE || /\bERROR\b|Unhandled|Error:/.test(line)) console.log(`[worker ${taskQueue}] ${line.slice(0, 400)}`);
    },
  });
  workers.push(proc);
  return proc;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'controller-e2e-'));
  server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  await upDeployment({ config: GYM_YAML, runDir: join(dir, 'gym'), env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' } });
  connection = await Connection.connect({ address: server.address });
  client = new Client({ connection });
});

afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop(3_000)));
  await connection?.close();
  await downDeployment(join(dir, 'gym')).catch(() => undefined);
  await server?.stop();
  await rm(dir, { recursive: true, force: true });
});

function config(name: string, taskQueue: string, extra: Partial<Record<string, unknown>> = {}): RunConfig {
  return RunConfigSchema.parse({
    run: { name, gym_run_dir: join(dir, 'gym'), checkpoint_dir: join(dir, name, 'checkpoints'), task_queue: taskQueue, rollout_task_queue: `${taskQueue}-run` },
    grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 4, max_num_steps: 6, tasksets: ['counter', 'weather', 'genrm'] },
    rollout_checkpointing: { snapshot_attempt_interval_s: 1, gym: { prepare_timeout_s: 30 } },
    trainer: { enabled: false },
    checkpointing: { enabled: false },
    ...extra,
  });
}

async function metricsOf(cfg: RunConfig): Promise<CheckpointOutcome[]> {
  const text = await readFile(join(cfg.run.checkpoint_dir, 'checkpoint_metrics.jsonl'), 'utf8');
  return text.trim().split('\n').map((l) => JSON.parse(l) as CheckpointOutcome);
}

/** Every rollout attempt workflow of the run, by capture key → statuses. */
async function rolloutWorkflows(run: string): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  for await (const wf of client.workflow.list({ query: `WorkflowType = 'rolloutAttempt'` })) {
    if (!wf.workflowId.startsWith(`${run}/rollout/`)) continue;
    const key = wf.workflowId.slice(`${run}/rollout/`.length);
    out.set(key, [...(out.get(key) ?? []), wf.status.name]);
  }
  return out;
}

/** The reasons of rollout attempts that did not complete (for a failure message). */
async function failedRollouts(run: string): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const wf of client.workflow.list({ query: `WorkflowType = 'rolloutAttempt'` })) {
    if (!wf.workflowId.startsWith(`${run}/rollout/`)) continue;
    const memo = (wf.memo ?? {}) as { status?: string };
    if (memo.status === 'completed') continue;
    const r = await client.workflow.getHandle(wf.workflowId).result().catch((e: unknown) => String(e));
    out.push({ id: wf.workflowId, status: wf.status.name, result: r });
  }
  return out;
}

describe('controller on the dev server with a real Gym', () => {
  it('a training run with periodic checkpoints finishes every rollout exactly once', async () => {
    const worker = startWorkerProcess('e2e-periodic');
    await waitForLine(worker, /worker: polling/, 60_000);
    const cfg = config('e2e-periodic', 'e2e-periodic');
    const handle = await startRun(client, cfg);
    const summary = await handle.result();
    const expected = cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt;
    expect(summary.steps).toBe(cfg.grpo.max_num_steps);
    expect(summary.completedRollouts).toBe(expected);
    expect(summary.failedRollouts).toBe(0);
    // A quiet machine finishes 6 steps in a few seconds: at least one periodic snapshot, every one completed.
    const completed = summary.checkpoints.filter((c) => c.outcome === 'completed');
    expect(completed.length).toBeGreaterThanOrEqual(1);
    expect(completed.every((c) => c.trigger === 'periodic' && c.snapshotDir)).toBe(true);
    expect(summary.checkpoints.filter((c) => c.outcome === 'failed')).toEqual([]);
    // one attempt workflow per rollout, each completed once
    const rollouts = await rolloutWorkflows(cfg.run.name);
    expect(rollouts.size).toBe(expected);
    for (const [key, statuses] of rollouts) expect(statuses, key).toEqual(['COMPLETED']);
    // the metrics file holds one line per attempt with stage seconds
    const metrics = await metricsOf(cfg);
    expect(metrics.length).toBe(summary.checkpoints.length);
    for (const m of metrics.filter((x) => x.outcome === 'completed')) {
      expect(m.seconds.prepare).toBeGreaterThan(0);
      expect(m.seconds.admission_closed_seconds).toBeGreaterThan(0);
    }
  });

  it('a worker SIGKILLed in the middle of a checkpoint attempt: a new worker finishes that attempt with the same ID', async () => {
    const tq = 'e2e-kill';
    const first = startWorkerProcess(tq);
    await waitForLine(first, /worker: polling/, 60_000);
    const cfg = config('e2e-kill', tq, { rollout_checkpointing: { snapshot_attempt_interval_s: 2, gym: { prepare_timeout_s: 30 } } });
    const handle = await startRun(client, cfg);
    // Wait for a checkpoint attempt to be running, then kill the worker under it.
    let attemptId: string | undefined;
    for (let i = 0; i < 600 && !attemptId; i++) {
      for await (const wf of client.workflow.list({ query: `WorkflowType = 'checkpointAttempt' AND ExecutionStatus = 'Running'` })) {
        if (wf.workflowId.startsWith(`${cfg.run.name}/checkpoint/`)) attemptId = wf.workflowId;
      }
      if (!attemptId) await new Promise((r) => setTimeout(r, 50));
    }
    expect(attemptId).toBeDefined();
    await first.kill();
    const statusWhileDown = await client.workflow.getHandle(attemptId!).describe();
    expect(statusWhileDown.status.name).toBe('RUNNING');

    const second = startWorkerProcess(tq);
    await waitForLine(second, /worker: polling/, 60_000);
    const progress = setInterval(() => {
      void handle
        .query(runStatus)
        .then((s) => console.log(`[e2e-kill] ${s.phase} steps=${s.steps} inFlight=${s.inFlight} done=${s.completedRollouts} ckpts=${s.checkpoints.map((c) => c.reason).join(',')}`))
        .catch(() => undefined);
    }, 5_000);
    const summary = await handle.result().finally(() => clearInterval(progress));
    expect(summary.steps).toBe(cfg.grpo.max_num_steps);
    // the interrupted attempt finished (same workflow ID = same checkpoint ID), exactly once
    const checkpointId = attemptId!.slice(`${cfg.run.name}/checkpoint/`.length);
    const attempt = await client.workflow.getHandle(attemptId!).result();
    expect(attempt.checkpointId).toBe(checkpointId);
    expect(['completed', 'failed']).toContain(attempt.outcome);
    const withId = summary.checkpoints.filter((c) => c.checkpointId === checkpointId);
    expect(withId).toHaveLength(1);
    // no duplicate publication: every published snapshot directory is distinct
    const dirs = summary.checkpoints.filter((c) => c.snapshotDir).map((c) => c.snapshotDir);
    expect(new Set(dirs).size).toBe(dirs.length);
    // dispatch reopened after it: the run finished every rollout
    if (summary.failedRollouts > 0) console.log('[e2e-kill] failed rollouts:', JSON.stringify(await failedRollouts(cfg.run.name)));
    const expected = cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt;
    expect(summary.completedRollouts).toBe(expected);
    const status = await handle.query(runStatus).catch(() => undefined);
    if (status) expect(status.gates.gymCheckpoint).toBe(false);
  }, 240_000);
});
