// The worker process as `npm run worker` starts it (JSON logs by default) with --metrics-address,
// on the dev server with a real Gym (the counter environment only): a short run with a manual
// checkpoint, then the worker's /metrics scraped and parsed strictly (the SDK's temporal_* and the
// controller's controller_* metrics, checked against the run's summary), and every line the worker
// wrote parsed as JSON with the Gym servers' pino field names.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, type Connection } from '@temporalio/client';
import { Agent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTo } from '../helpers/temporal.js';
import { RunConfigSchema } from '../../protocol/run-config.js';
import { startRun } from '../../scripts/run.js';
import { freePort, startDevServer, type DevServer } from '../../scripts/temporal-dev.mjs';
import { downDeployment, upDeployment } from '../../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { checkpointNow } from '../../workflows/messages.js';
import { METRICS } from '../../workflows/metrics.js';
import type { RunSummary } from '../../workflows/trainingRun.js';
import { family, type Sample, scrape, type Scrape } from '../helpers/prometheus.js';
import { waitFor } from '../helpers/wait.js';

const TOKEN = 'telemetry-e2e-token';
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const TQ = 'e2e-telemetry';
const GYM_YAML = `checkpoint: { enabled: true }
servers:
  policy_backend: { kind: inference, options: { seed: 1 } }
  policy_model: { kind: model, options: { backend: policy_backend, checkpoint_policy: true } }
  simple_agent: { kind: agent, options: { model: policy_model, max_steps: 8 } }
  counter: { kind: resources, type: counter }
  counter_env: { kind: environment, options: { agent: simple_agent, resources: counter } }
`;

let dir: string;
let server: DevServer;
let connection: Connection;
let client: Client;
let worker: GroupProcess;
let metricsUrl: string;
const dispatcher = new Agent();
const lines: Array<{ stream: 'stdout' | 'stderr'; line: string }> = [];
let summary: RunSummary;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'worker-telemetry-'));
  server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  await writeFile(join(dir, 'gym.yaml'), GYM_YAML);
  await upDeployment({ config: join(dir, 'gym.yaml'), runDir: join(dir, 'gym'), env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' } });
  connection = await connectTo(server);
  client = new Client({ connection });
  const metricsAddress = `127.0.0.1:${await freePort()}`;
  metricsUrl = `http://${metricsAddress}`;
  const { WORKER_LOG_FORMAT: _format, ...inherited } = process.env;
  worker = spawnGroup({
    command: process.execPath,
    args: ['--import', 'tsx', join(ROOT, 'worker.ts'), '--address', server.address, '--task-queue', TQ, '--rollout-task-queue', `${TQ}-run`],
    // The flag's environment variable; no WORKER_LOG_FORMAT: JSON is the default.
    env: { ...inherited, GYM_CONTROL_TOKEN: TOKEN, WORKER_METRICS_ADDRESS: metricsAddress },
    cwd: ROOT,
    onLine: (line, stream) => lines.push({ stream, line }),
  });
  await waitForLine(worker, /worker: polling/, 120_000);
}, 300_000);

afterAll(async () => {
  await worker?.stop(3_000);
  await connection?.close();
  await dispatcher.close();
  await downDeployment(join(dir, 'gym')).catch(() => undefined);
  await server?.stop();
  await rm(dir, { recursive: true, force: true });
});

const having = (labels: Record<string, string>) => (m: Sample) => Object.entries(labels).every(([k, v]) => m.labels[k] === v);

/** Sum of a counter's samples whose labels include `labels` (the SDK adds namespace, taskQueue, workflowType); 0 if none yet. */
function total(s: Scrape, name: string, labels: Record<string, string> = {}): number {
  const f = s.families.get(name);
  if (!f) return 0;
  expect(f.type).toBe('counter');
  return f.samples.filter(having(labels)).reduce((n, m) => n + m.value, 0);
}

/** A histogram's `_count` and `_sum` over its series whose labels include `labels`. */
function observed(s: Scrape, name: string, labels: Record<string, string>): { count: number; sum: number } {
  const samples = family(s, name, 'histogram').samples.filter(having(labels));
  const add = (suffix: string): number => samples.filter((m) => m.name === `${name}${suffix}`).reduce((n, m) => n + m.value, 0);
  return { count: add('_count'), sum: add('_sum') };
}

describe('worker telemetry', () => {
  it("serves the SDK's and the controller's metrics on --metrics-address", async () => {
    const cfg = RunConfigSchema.parse({
      run: { name: 'telemetry-run', gym_run_dir: join(dir, 'gym'), checkpoint_dir: join(dir, 'checkpoints'), task_queue: TQ, rollout_task_queue: `${TQ}-run` },
      grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 2, max_num_steps: 2, tasksets: ['counter'] },
      rollout_checkpointing: { restore_mode: 'none', gym: { prepare_timeout_s: 30 } },
      trainer: { enabled: false },
      checkpointing: { enabled: false },
    });
    const handle = await startRun(client, cfg);
    // Sent at once: the run serves it before it may end.
    const manual = await handle.executeUpdate(checkpointNow);
    expect(manual.outcome, JSON.stringify(manual)).toBe('completed');
    summary = await handle.result();
    expect(summary.completedRollouts).toBe(2 * 2 * 2);

    // Workflow metrics leave with each task's completion: the last shard's may trail the result.
    const s = await waitFor(
      'the rollouts completed in the summary',
      async () => {
        const got = await scrape(dispatcher, metricsUrl);
        return total(got, METRICS.rolloutsCompleted) === summary.completedRollouts ? got : undefined;
      },
      10_000,
    );
    expect(s.status).toBe(200);
    expect(s.contentType).toMatch(/^text\/plain/);
    // The SDK's own, prefixed temporal_.
    expect(family(s, 'temporal_workflow_completed', 'counter').samples.length).toBeGreaterThan(0);
    expect(family(s, 'temporal_activity_execution_latency', 'histogram').samples.length).toBeGreaterThan(0);
    // The controller's.
    const completedCheckpoints = summary.checkpoints.filter((c) => c.outcome === 'completed');
    expect(completedCheckpoints.length).toBeGreaterThanOrEqual(1);
    expect(total(s, METRICS.checkpoints, { outcome: 'completed', reason: 'completed', trigger: 'manual' })).toBeGreaterThanOrEqual(1);
    expect(total(s, METRICS.checkpoints)).toBe(summary.checkpoints.length);
    const labelled = family(s, METRICS.checkpoints, 'counter').samples[0]!.labels;
    // The SDK's tags of workflow metrics (camelCase, unlike its own metrics' labels).
    expect(labelled).toMatchObject({ workflowType: 'trainingRun', taskQueue: TQ, namespace: 'default' });
    // (`ledger_cut` only when a shard wrote its part again: an episode ended before Gym's cut.)
    for (const stage of ['allocate', 'candidates', 'prepare', 'commit', 'publish', 'resume', 'admission_closed', 'total']) {
      const h = observed(s, METRICS.checkpointStageSeconds, { stage, outcome: 'completed' });
      expect(h.count, stage).toBeGreaterThanOrEqual(completedCheckpoints.length);
      // A stage within one workflow task takes 0 s on the workflow clock; the whole attempt does not.
      expect(h.sum, stage).toBeGreaterThan(stage === 'total' ? 0 : -1);
    }
    expect(observed(s, METRICS.gymParticipantSeconds, { outcome: 'completed' }).count).toBeGreaterThanOrEqual(1);
    expect(total(s, METRICS.rolloutsCompleted, { workflowType: 'rolloutShard' })).toBe(summary.completedRollouts);
    expect(total(s, METRICS.rolloutsDispatched)).toBeGreaterThanOrEqual(summary.completedRollouts);
    expect(total(s, METRICS.rolloutsFailed)).toBe(summary.failedRollouts);
    // No recovery in this run; no series carries a run, rollout, capture key or checkpoint ID.
    expect(total(s, METRICS.recoveries)).toBe(0);
    const controller = [...s.families.values()].filter((f) => f.name.startsWith('controller_'));
    for (const f of controller) for (const m of f.samples) for (const v of Object.values(m.labels)) expect(v).not.toMatch(/telemetry-run|rollout-step-|\.p\d/);
  }, 240_000);

  it('writes every log line as JSON with the Gym servers field names, the run on workflow lines', async () => {
    expect(summary, 'the run of the first test').toBeDefined();
    // The SDK holds log lines ~100 ms to sort them with core's: the last step's may trail the result.
    await waitFor('both training step lines', () => lines.filter(({ line }) => line.includes('"msg":"training step"')).length === 2, 5_000);
    const records = lines.map(({ stream, line }) => {
      let r: Record<string, unknown>;
      try {
        r = JSON.parse(line) as Record<string, unknown>;
      } catch {
        throw new Error(`${stream}: not JSON: ${line}`);
      }
      expect(stream, line).toBe('stderr');
      expect(typeof r.level, line).toBe('number');
      expect([10, 20, 30, 40, 50]).toContain(r.level);
      expect(typeof r.time, line).toBe('number');
      expect(Math.abs((r.time as number) - Date.now()), line).toBeLessThan(3_600_000);
      expect(typeof r.msg, line).toBe('string');
      expect(r.component, line).toBe('worker');
      return r;
    });
    // The worker's own line, and the SDK's.
    expect(records.find((r) => /^worker: polling /.test(r.msg as string))).toMatchObject({ level: 30 });
    expect(records.some((r) => r.sdkComponent === 'worker')).toBe(true);
    // Workflow log calls carry the workflow's metadata, flattened, and the run.
    const step = records.find((r) => r.msg === 'training step' && r.step === 1);
    expect(step).toMatchObject({
      level: 30,
      sdkComponent: 'workflow',
      workflowType: 'trainingRun',
      workflowId: 'telemetry-run',
      run: 'telemetry-run',
      taskQueue: TQ,
    });
    expect(typeof step?.runId).toBe('string');
  });
});
