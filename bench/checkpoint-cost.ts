// checkpoint-cost: what checkpointing costs a training run, on vs off, in one process.
//
//   npm run bench -- checkpoint-cost [--steps 4] [--prompts 8] [--generations 4]
//                                    [--groups-in-flight 12] [--interval <s>] [--repeat 1]
//                                    [--token-delay-ms 0]
//
// The same training run (same name and seed, so the same rollout IDs and tasks; trainer on: a
// GRPO step and a refit of the backend per step) through the Temporal controller, once with
// `checkpointing.enabled: false` and once with trainer anchors every step, each followed by a
// Gym-aware snapshot (trainer boundary), plus periodic snapshots every --interval seconds if given.
// Each variant gets a fresh Gym deployment (a fresh backend: initial policy, empty call log), a
// fresh checkpoint directory and a fresh in-memory trainer; one Temporal dev server and one set
// of workers serve all of them. --repeat 2 runs off, on, on, off.
//
// Throughput: rollout tokens (the backend call log's decoded tokens) per second of run wall time.
// The ratio on / off is the cost. Sampling depends on the policy version a rollout runs under,
// and with async RL that depends on timing, so the two variants make nearly, not exactly, the
// same calls: tokens/s, not wall time, is compared.
// Per step: the trainer anchor (saveTrainerCheckpoint + writeGymRestartFallback, from the run's
// history), the snapshot's stages from its outcome — Gym prepare and commit, the controller's
// ledger cut, publish (manifest, validation, rename), resume — and the rest of its total
// (allocation, the topology check, retention, workflow task latency); admission-closed seconds
// per snapshot from `seconds.admission_closed_seconds`.
// --token-delay-ms makes the backend wait per generated token (longer rollouts, the same work).
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { Client, Connection, type WorkflowHandle } from '@temporalio/client';
import { createTrainerActivities } from '../activities/trainer.js';
import type { CheckpointOutcome } from '../protocol/controller.js';
import { RunConfigSchema, type RunConfig } from '../protocol/run-config.js';
import { startRun } from '../scripts/run.js';
import { freePort, startDevServer } from '../scripts/temporal-dev.mjs';
import { downDeployment, upDeployment } from '../servers/launcher/launcher.js';
import { createControllerWorkers } from '../worker.js';
import { onExit } from './lib/cleanup.js';
import { eventMs } from './lib/history-timing.js';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';
import { Backend, TOKEN, gymYaml } from './scale.js';

type Variant = 'off' | 'on';

interface ActivitySpan {
  name: string;
  seconds: number;
}

/** Activity durations (scheduled → completed) of a workflow's history, in schedule order. */
async function activitySpans(handle: WorkflowHandle): Promise<ActivitySpan[]> {
  const history = await handle.fetchHistory();
  const scheduled = new Map<string, { name: string; at: number }>();
  const out: ActivitySpan[] = [];
  for (const e of history.events ?? []) {
    const s = e.activityTaskScheduledEventAttributes;
    if (s) scheduled.set(String(e.eventId), { name: s.activityType?.name ?? '?', at: eventMs(e.eventTime) });
    const c = e.activityTaskCompletedEventAttributes;
    if (c) {
      const from = scheduled.get(String(c.scheduledEventId));
      if (from) out.push({ name: from.name, seconds: (eventMs(e.eventTime) - from.at) / 1000 });
    }
  }
  return out;
}

const stepOf = (checkpointId: string): number | null => {
  const m = /^rollout-step-(\d+)-snapshot-/.exec(checkpointId);
  return m ? Number(m[1]) : null;
};

const mean = (xs: number[]): number => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      steps: { type: 'string', default: '4' },
      prompts: { type: 'string', default: '8' },
      generations: { type: 'string', default: '4' },
      'groups-in-flight': { type: 'string', default: '12' },
      interval: { type: 'string' },
      tasksets: { type: 'string', default: 'weather,counter' },
      repeat: { type: 'string', default: '1' },
      seed: { type: 'string', default: '3' },
      'token-delay-ms': { type: 'string', default: '0' },
    },
  });
  const steps = Number(values.steps);
  const prompts = Number(values.prompts);
  const generations = Number(values.generations);
  const inFlight = Number(values['groups-in-flight']);
  const interval = values.interval === undefined ? null : Number(values.interval);
  const repeat = Math.max(1, Number(values.repeat));
  const tasksets = values.tasksets!.split(',').map((s) => s.trim()) as RunConfig['grpo']['tasksets'];
  const rollouts = steps * prompts * generations;
  const tokenDelayMs = Number(values['token-delay-ms']);

  const dir = await mkdtemp(join(tmpdir(), 'bench-ckptcost-'));
  const env = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'error' };
  console.log(
    `checkpoint-cost: ${steps} steps × ${prompts} prompts × ${generations} generations = ${rollouts} rollouts, ` +
      `${inFlight} groups in flight, periodic snapshots ${interval === null ? 'off' : `every ${interval} s`}, ${tokenDelayMs} ms per generated token`,
  );
  // Worker state changes and the like are not part of the report.
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  const stopServer = onExit('the Temporal dev server', () => server.stop());
  const workers = await createControllerWorkers({ address: server.address, controlToken: TOKEN, taskQueue: 'ckptcost', rolloutTaskQueue: 'ckptcost-run' });
  const running = workers.run();
  const connection = await Connection.connect({ address: server.address });
  const client = new Client({ connection });
  const trainer = createTrainerActivities();
  await writeFile(join(dir, 'gym.yaml'), gymYaml({ tokenDelayMs }));

  const order: Variant[] = [];
  for (let r = 0; r < repeat; r++) order.push(...(r % 2 === 0 ? (['off', 'on'] as const) : (['on', 'off'] as const)));
  const runs: Row[] = [];
  const stepRows: Row[] = [];
  const snapshots: Array<{ variant: Variant; o: CheckpointOutcome }> = [];
  const problems: string[] = [];
  const RUN = 'ckptcost';

  for (const [i, variant] of order.entries()) {
    const runDir = join(dir, `gym-${i}`);
    const stopGym = onExit('the Gym deployment', () => downDeployment(runDir));
    const up = await upDeployment({ config: join(dir, 'gym.yaml'), runDir, env, healthTimeoutMs: 180_000 });
    const backend = new Backend(up.endpoints.policy_backend!.url);
    // The trainer lives in this process (the worker's memory), keyed by run: start it fresh.
    await trainer.dropTrainerState({ run: RUN });
    const cfg = RunConfigSchema.parse({
      run: {
        name: RUN,
        gym_run_dir: runDir,
        checkpoint_dir: join(dir, `checkpoints-${i}`),
        seed: Number(values.seed),
        task_queue: 'ckptcost',
        rollout_task_queue: 'ckptcost-run',
      },
      grpo: {
        num_prompts_per_step: prompts,
        num_generations_per_prompt: generations,
        max_num_steps: steps,
        tasksets,
        environments: { weather: 'weather_env', counter: 'counter_env' },
      },
      async_rl: { max_in_flight_groups: inFlight },
      rollout_checkpointing: { snapshot_attempt_interval_s: variant === 'on' ? interval : null },
      checkpointing: { enabled: variant === 'on', save_period: 1 },
      trainer: { enabled: true },
      // One history for the whole run (the trainer anchors are read from it).
      controller: { max_history_events: 50_000 },
    });
    const t0 = performance.now();
    const handle = await startRun(client, cfg);
    const summary = await handle.result();
    const wall = (performance.now() - t0) / 1000;
    const calls = await backend.calls();
    const tokens = calls.reduce((s, c) => s + (c.decoded_tokens ?? 0), 0);
    const spans = await activitySpans(handle);
    const anchors = spans.filter((s) => s.name === 'saveTrainerCheckpoint');
    const fallbacks = spans.filter((s) => s.name === 'writeGymRestartFallback');
    const trainSteps = spans.filter((s) => s.name === 'trainStep');
    const outcomes = summary.checkpoints;
    for (const o of outcomes) {
      snapshots.push({ variant, o });
      if (o.outcome !== 'completed') problems.push(`${variant}: snapshot ${o.checkpointId} ${o.outcome}/${o.reason} ${o.error ?? ''}`);
    }
    if (summary.steps !== steps) problems.push(`${variant}: ${summary.steps} of ${steps} steps`);
    if (summary.failedRollouts > 0) problems.push(`${variant}: ${summary.failedRollouts} failed rollout attempts`);
    const closed = outcomes.map((o) => o.seconds.admission_closed_seconds ?? 0);
    runs.push({
      run: i + 1,
      checkpointing: variant,
      steps: summary.steps,
      rollouts: summary.completedRollouts,
      model_calls: calls.length,
      tokens,
      wall_s: round3(wall),
      tokens_per_s: Math.round(tokens / wall),
      train_step_s: round3(mean(trainSteps.map((s) => s.seconds))),
      snapshots: outcomes.length,
      anchor_s: round3(mean(anchors.map((s, k) => s.seconds + (fallbacks[k]?.seconds ?? 0)))),
      snapshot_s: round3(mean(outcomes.map((o) => o.seconds.total ?? 0))),
      admission_closed_s: round3(mean(closed)),
      reward_last_step: round3(summary.rewardPerStep[summary.rewardPerStep.length - 1] ?? 0),
    });
    if (variant === 'on') {
      // Per step: its anchor, then its trainer-boundary snapshot (periodic ones are listed with step "p").
      for (const o of outcomes) {
        const step = stepOf(o.checkpointId);
        const s = o.seconds;
        const staged = (s.prepare ?? 0) + (s.commit ?? 0) + (s.ledger_cut ?? 0) + (s.publish ?? 0) + (s.resume ?? 0);
        const anchorIdx = o.trigger === 'trainer_boundary' && step !== null ? step - 1 : -1;
        const anchor = anchorIdx >= 0 ? (anchors[anchorIdx]?.seconds ?? 0) + (fallbacks[anchorIdx]?.seconds ?? 0) : null;
        stepRows.push({
          run: i + 1,
          step: o.trigger === 'trainer_boundary' ? (step ?? '?') : `p${step ?? ''}`,
          trigger: o.trigger,
          in_scope: o.scopeCount ?? 0,
          anchor_s: anchor === null ? null : round3(anchor),
          prepare_s: round3(s.prepare ?? 0),
          commit_s: round3(s.commit ?? 0),
          ledger_cut_s: round3(s.ledger_cut ?? 0),
          publish_s: round3(s.publish ?? 0),
          resume_s: round3(s.resume ?? 0),
          other_s: round3((s.total ?? 0) - staged),
          snapshot_s: round3(s.total ?? 0),
          step_checkpoint_s: round3((anchor ?? 0) + (s.total ?? 0)),
          admission_closed_s: round3(s.admission_closed_seconds ?? 0),
        });
      }
    }
    console.log(`  ${variant}: ${summary.completedRollouts} rollouts, ${tokens} tokens in ${round3(wall)} s, ${outcomes.length} snapshots`);
    await stopGym();
  }

  const rate = (v: Variant): number => median(runs.filter((r) => r.checkpointing === v).map((r) => Number(r.tokens_per_s)));
  const ratio = rate('on') / rate('off');
  const onSnapshots = snapshots.filter((s) => s.variant === 'on').map((s) => s.o);
  const admissionClosed = mean(onSnapshots.map((o) => o.seconds.admission_closed_seconds ?? 0));
  const stepCkpt = mean(stepRows.filter((r) => r.trigger === 'trainer_boundary').map((r) => Number(r.step_checkpoint_s)));
  console.log('');
  printTable(runs);
  console.log('\nper snapshot (checkpointing on):');
  printTable(stepRows);
  console.log(
    `\nthroughput on / off (tokens/s, median): ${round3(ratio)}; admission closed per snapshot: ${round3(admissionClosed)} s; ` +
      `checkpoint time per step (anchor + snapshot): ${round3(stepCkpt)} s`,
  );
  // Longer rollouts are another configuration: kept apart from the default's result.
  const file = writeBenchResult(
    tokenDelayMs > 0 ? `checkpoint-cost-token-delay-${tokenDelayMs}ms` : 'checkpoint-cost',
    {
      rollouts,
      token_delay_ms: tokenDelayMs,
      throughput_ratio: round3(ratio),
      admission_closed_s: round3(admissionClosed),
      step_checkpoint_s: round3(stepCkpt),
      tokens_per_s_off: rate('off'),
      tokens_per_s_on: rate('on'),
    },
    [...runs, ...stepRows.map((r) => ({ table: 'snapshot', ...r }))],
  );
  console.log(`wrote ${file}`);

  await connection.close();
  await workers.shutdown();
  await running;
  await stopServer();
  await rm(dir, { recursive: true, force: true });
  if (problems.length) {
    console.error(`checkpoint-cost: ${problems.length} problems:\n  ${problems.slice(0, 20).join('\n  ')}`);
    process.exit(1);
  }
  process.exit(0);
}

await main();
