// A training run with `trainer: none` over a Gym deployment whose policy model is llama.cpp
// running SmolLM2-135M (no `kind: inference` server at all): the dev server, a worker process, real
// Gym processes. Mid-run every new model call is held at the recording proxy, a checkpoint parks
// the episodes in flight, every Gym process is SIGKILLed and fresh ones start; the run recovers
// and finishes, and each step's batch is on disk in rollout_batches.jsonl, once, with the calls
// the model made (as text: llama.cpp returns no token IDs).
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, type Connection } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTo } from '../../helpers/temporal.js';
import { readRolloutBatches } from '../../../activities/rollout-batches.js';
import { RunConfigSchema } from '../../../protocol/run-config.js';
import { startRun } from '../../../scripts/run.js';
import { freePort, startDevServer, type DevServer } from '../../../scripts/temporal-dev.mjs';
import { downDeployment, killDeployment, restartDeployment, upDeployment } from '../../../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../../servers/launcher/process-group.js';
import { checkpointNow, runStatus } from '../../../workflows/messages.js';
import { LLAMA_BUILD_WAIT_MS, llamaDeploymentYaml, RecordingProxy, startLlama, type LlamaServer } from './harness.js';
import { waitFor } from '../../helpers/wait.js';

const TOKEN = 'llama-run-e2e-token';
const KEY_ENV = 'LLAMA_RUN_E2E_API_KEY';
const KEY = 'llama-run-key-0d4e';
const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const GYM_ENV = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' };

let dir: string;
let llama: LlamaServer | undefined;
let proxy: RecordingProxy | undefined;
let server: DevServer | undefined;
let connection: Connection | undefined;
let worker: GroupProcess | undefined;

beforeAll(async () => {
  llama = await startLlama({ apiKey: KEY });
  proxy = new RecordingProxy(llama.url);
  await proxy.start();
  process.env[KEY_ENV] = KEY;
  dir = await mkdtemp(join(tmpdir(), 'llama-run-e2e-'));
  const config = join(dir, 'gym-llama.yaml');
  await writeFile(config, llamaDeploymentYaml({ backendUrl: proxy.url, apiKeyEnv: KEY_ENV, maxSteps: 3 }));
  server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  await upDeployment({ config, runDir: join(dir, 'gym'), env: GYM_ENV, healthTimeoutMs: 60_000 });
  connection = await connectTo(server);
  worker = spawnGroup({
    command: process.execPath,
    args: ['--import', 'tsx', join(ROOT, 'worker.ts'), '--address', server.address, '--task-queue', 'llama-run', '--rollout-task-queue', 'llama-run-run'],
    env: { ...process.env, GYM_CONTROL_TOKEN: TOKEN },
    cwd: ROOT,
    onLine: (line) => {
      if (process.env.E2E_VERBOSE || /\bERROR\b|"level":50|Unhandled|Error:/.test(line)) console.log(`[worker] ${line.slice(0, 400)}`);
    },
  });
  await waitForLine(worker, /worker: polling/, 60_000);
}, LLAMA_BUILD_WAIT_MS + 240_000);

afterAll(async () => {
  await worker?.stop(3_000);
  await connection?.close();
  if (dir) await downDeployment(join(dir, 'gym')).catch(() => undefined);
  await server?.stop();
  await proxy?.stop();
  await llama?.stop();
  delete process.env[KEY_ENV];
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('trainer none over llama.cpp', () => {
  it('a run collects every step’s batch through a Gym crash, with no inference server to refit', { timeout: 600_000 }, async () => {
    const cfg = RunConfigSchema.parse({
      run: {
        name: 'llama-none',
        gym_run_dir: join(dir, 'gym'),
        checkpoint_dir: join(dir, 'checkpoints'),
        task_queue: 'llama-run',
        rollout_task_queue: 'llama-run-run',
      },
      grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 2, max_num_steps: 3, tasksets: ['weather'], environments: { weather: 'weather_env' } },
      async_rl: { max_in_flight_groups: 2 },
      trainer: 'none',
      rollout_checkpointing: { gym: { prepare_timeout_s: 30 } },
      controller: { run_heartbeat_timeout_s: 15 },
    });
    const client = new Client({ connection: connection! });
    const t0 = Date.now();
    const handle = await startRun(client, cfg);
    await waitFor('step 1', async () => (await handle.query(runStatus)).steps >= 1, 120_000);

    // Park the episodes in flight: their next model call waits at the proxy; checkpoint them.
    proxy!.holdTurn(0);
    await waitFor('two calls held', () => proxy!.held().length >= 2, 120_000);
    const outcome = await handle.executeUpdate(checkpointNow);
    expect(outcome).toMatchObject({ outcome: 'completed' });
    expect(outcome.scopeCount ?? 0).toBeGreaterThanOrEqual(2);

    await killDeployment(join(dir, 'gym'));
    proxy!.release();
    await restartDeployment(join(dir, 'gym'), { env: GYM_ENV, healthTimeoutMs: 60_000 });

    const summary = await handle.result();
    const seconds = (Date.now() - t0) / 1000;
    console.log(
      `llama trainer-none run: ${seconds.toFixed(1)} s, recoveries ${JSON.stringify(summary.recoveries.map((r) => ({ continued: r.continued, restarted: r.restarted })))}, calls ${proxy!.generations().length}`,
    );
    const perStep = cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt;
    expect(summary).toMatchObject({ steps: 3, completedRollouts: 3 * perStep, failedRollouts: 0, trainerVersion: 0 });
    expect(summary.recoveries.length).toBeGreaterThanOrEqual(1);
    const continued = summary.recoveries.flatMap((r) => r.continuedSample);
    expect(continued.length).toBeGreaterThanOrEqual(2);

    const lines = await readRolloutBatches(cfg.run.checkpoint_dir);
    expect(lines.map((l) => l.step)).toEqual([1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    expect(new Set(lines.map((l) => l.rollout_id)).size).toBe(lines.length);
    for (const l of lines) {
      expect(l).toMatchObject({ run: 'llama-none', policy_version: 0, mask: false });
      expect(typeof l.reward).toBe('number');
      expect(l.calls.length).toBeGreaterThanOrEqual(1);
      for (const c of l.calls) {
        expect(c).toMatchObject({ capture: 'text', completion_token_ids: null, complete: true });
        expect(c.prompt_messages.length).toBeGreaterThanOrEqual(2);
        expect(c.completion_message.role).toBe('assistant');
      }
    }
    // The continued rollouts' lines name both attempts, and keep the calls made before the crash.
    const continuedIds = new Set(continued.map((k) => k.replace(/-a\d+$/, '')));
    const continuedLines = lines.filter((l) => continuedIds.has(l.rollout_id));
    expect(continuedLines.length).toBe(continuedIds.size);
    for (const l of continuedLines) expect(l.attempts.length).toBeGreaterThanOrEqual(2);
  });
});
