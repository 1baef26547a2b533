// `npm run demo [-- --keep]` (`--help`: DEMO_CLI): the whole system on this machine. A Temporal
// dev server (persisted under .data/demo/, Web UI), the Gym deployment of examples/gym.yaml (tiny-policy backend, policy
// model, agent, resources, environments), the controller's worker, and a training run over three
// environments with periodic and trainer-boundary checkpoints. Mid-run every Gym process is
// SIGKILLed and fresh ones started; later the worker is SIGKILLed and restarted. The run recovers
// and finishes; the summary is printed and written to .data/demo/summary.json, and the run's report
// (scripts/report.ts) to .data/demo/report.html.
import { randomBytes } from 'node:crypto';
import { appendFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client, Connection } from '@temporalio/client';
import type { RunSummary } from '../workflows/trainingRun.js';
import { RunConfigSchema } from '../protocol/run-config.js';
import { downDeployment, killDeployment, readEndpoints, restartDeployment, upDeployment } from '../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../servers/launcher/process-group.js';
import { checkpointNow, runStatus, type RunStatus } from '../workflows/messages.js';
import { ROLLOUT_STATUS } from '../workflows/search-attributes.js';
import { screenshotRunInUi } from './ui-screenshots.js';
import { defineCommand, parseCommandLine } from './cli.mjs';
import { writeRunReport } from './report/fetch.js';
import { startRun } from './run.js';
import { projectRoot } from './temporal-paths.mjs';
import { freePort, isPortFree, startDevServer } from './temporal-dev.mjs';

const DEMO_CLI = defineCommand({
  name: 'demo',
  invocation: 'npm run demo',
  usage: ['npm run demo [-- --keep]'],
  summary:
    'The whole system on this machine (1–3 minutes): a Temporal dev server (persisted under .data/demo/, Web UI), the Gym deployment of examples/gym.yaml, ' +
    "the controller's worker and a 10-step training run. Mid-run every Gym process is SIGKILLed and fresh ones started, later the worker; " +
    'the run recovers and finishes. The summary is printed and written to .data/demo/summary.json, the run report (npm run report) to .data/demo/report.html.',
  flags: {
    keep: { type: 'boolean', help: 'leave the dev server running afterwards to browse its Web UI (http://127.0.0.1:8233); the next demo reuses it' },
  },
  env: [
    { name: 'GYM_CONTROL_TOKEN', help: 'the Gym control token shared by the servers and the worker (default: a random one)' },
    { name: 'GYM_SESSION_SECRET', help: 'passed to the Gym servers (see npm run gym -- --help)' },
    { name: 'NG_RECORDS_DEFER_MIN_BYTES', help: 'passed to the Gym servers (see npm run gym -- --help)' },
  ],
  notes: ['The dev server takes ports 7233 and 8233 when they are free, else free ones. Exit status: 0 the run finished without duplicates; 1 otherwise.'],
});

const demoDir = join(projectRoot, '.data', 'demo');
const keptFile = join(demoDir, 'server.json');
const keep = parseCommandLine(DEMO_CLI, process.argv.slice(2)).values.keep ?? false;
const token = process.env.GYM_CONTROL_TOKEN ?? randomBytes(16).toString('hex');
const say = (msg: string): void => console.log(`[demo] ${msg}`);

interface KeptServer {
  pid: number;
  address: string;
  uiUrl: string;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function devServer(): Promise<{ kept: KeptServer; stop?: () => Promise<void> }> {
  if (existsSync(keptFile)) {
    const kept = JSON.parse(readFileSync(keptFile, 'utf8')) as KeptServer;
    if (isAlive(kept.pid)) {
      say(`reusing the dev server left running by --keep (pid ${kept.pid}) on ${kept.address}`);
      return { kept };
    }
    rmSync(keptFile, { force: true });
  }
  const port = (await isPortFree(7233)) ? 7233 : await freePort();
  const uiPort = (await isPortFree(8233)) ? 8233 : await freePort();
  const server = await startDevServer({ port, uiPort, dbFile: join(demoDir, 'temporal.sqlite') });
  const kept = { pid: server.pid!, address: server.address, uiUrl: server.uiUrl! };
  say(`Temporal dev server on ${server.address}, Web UI ${server.uiUrl}`);
  if (keep) {
    server.keepRunning();
    writeFileSync(keptFile, `${JSON.stringify(kept, null, 2)}\n`);
    return { kept };
  }
  return { kept, stop: () => server.stop() };
}

function startWorker(address: string, taskQueue: string): GroupProcess {
  const logFile = join(demoDir, 'worker.log');
  return spawnGroup({
    onLine: (line) => appendFileSync(logFile, `${line}\n`),
    command: process.execPath,
    args: ['--import', 'tsx', join(projectRoot, 'worker.ts'), '--address', address, '--task-queue', taskQueue, '--rollout-task-queue', `${taskQueue}-run`],
    env: { ...process.env, GYM_CONTROL_TOKEN: token },
    cwd: projectRoot,
  });
}

async function post(url: string, body: unknown = {}): Promise<void> {
  await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 120_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function main(): Promise<void> {
  mkdirSync(demoDir, { recursive: true });
  const { kept, stop } = await devServer();
  const gymDir = join(demoDir, 'gym');
  await downDeployment(gymDir).catch(() => undefined);
  rmSync(gymDir, { recursive: true, force: true });
  say('starting the Gym deployment (examples/gym.yaml) …');
  await upDeployment({ config: join(projectRoot, 'examples/gym.yaml'), runDir: gymDir, env: { GYM_CONTROL_TOKEN: token, LOG_LEVEL: 'warn' } });
  const backend = readEndpoints(gymDir).policy_backend!.url;
  await post(`${backend}/_ctl/reset`);

  const taskQueue = `demo-${Date.now()}`;
  let worker = startWorker(kept.address, taskQueue);
  await waitForLine(worker, /worker: polling/, 120_000);
  say('controller worker up');

  const runName = `demo-${new Date()
    .toISOString()
    .replace(/[-:T.Z]/g, '')
    .slice(0, 14)}`;
  const config = RunConfigSchema.parse({
    run: {
      name: runName,
      gym_run_dir: gymDir,
      checkpoint_dir: join(demoDir, 'checkpoints', runName),
      task_queue: taskQueue,
      rollout_task_queue: `${taskQueue}-run`,
    },
    grpo: { num_prompts_per_step: 4, num_generations_per_prompt: 4, max_num_steps: 10, tasksets: ['counter', 'weather', 'genrm'] },
    async_rl: { max_in_flight_groups: 8, rollout_timeout_s: 600 },
    checkpointing: { enabled: true, save_period: 1 },
    rollout_checkpointing: { snapshot_attempt_interval_s: 5, keep_latest_k: 2, gym: { prepare_timeout_s: 60 } },
    rollout_recovery: { target_level: 'turn' },
    // The demo SIGKILLs the worker: rollouts whose `/run` it held are retried once their heartbeat
    // timeout passes (default 120 s, which keeps thousands of parked rollouts cheap for Temporal).
    controller: { run_heartbeat_timeout_s: 20 },
  });
  const connection = await Connection.connect({ address: kept.address });
  const client = new Client({ connection });
  const handle = await startRun(client, config);
  const ui = `${kept.uiUrl}/namespaces/default/workflows/${encodeURIComponent(runName)}`;
  say(`training run ${runName} started — watch it: ${ui}`);

  let last: RunStatus | undefined;
  const progress = setInterval(() => {
    void handle
      .query(runStatus)
      .then((s) => {
        last = s;
        const r = s.rewardPerStep.length ? s.rewardPerStep[s.rewardPerStep.length - 1]!.toFixed(2) : '—';
        say(
          `step ${s.steps}/10  reward ${r}  in flight ${s.inFlight}  completed ${s.completedRollouts}  checkpoints ${s.checkpoints.filter((c) => c.outcome === 'completed').length}  [${s.phase}]`,
        );
      })
      .catch(() => undefined);
  }, 2_000);

  // --- the Gym crash: park every episode mid-turn, checkpoint, SIGKILL every Gym process -------
  await waitFor('step 3', async () => ((await handle.query(runStatus)).steps >= 3 ? true : undefined), 300_000);
  await post(`${backend}/_ctl/hold`, { after_calls_per_rollout: 1 });
  await waitFor('episodes in flight', async () => ((await handle.query(runStatus)).inFlight >= 8 ? true : undefined), 60_000).catch(() => undefined);
  await new Promise((r) => setTimeout(r, 1_500));
  const before = await handle.executeUpdate(checkpointNow);
  say(`checkpoint before the crash: ${before.outcome} (${before.scope?.length ?? 0} episodes saved mid-turn)`);
  say('💥 SIGKILL every Gym process (the inference backend survives) …');
  const killed = await killDeployment(gymDir);
  await post(`${backend}/_ctl/release`);
  await new Promise((r) => setTimeout(r, 1_000));
  await restartDeployment(gymDir, { env: { GYM_CONTROL_TOKEN: token, LOG_LEVEL: 'warn' } });
  say(`fresh Gym processes started (${killed.length} killed); the controller restores the last snapshot into them`);

  // --- the worker crash ------------------------------------------------------------------------
  await waitFor('step 6', async () => ((await handle.query(runStatus)).steps >= 6 ? true : undefined), 300_000);
  say('💥 SIGKILL the controller worker …');
  await worker.kill();
  await new Promise((r) => setTimeout(r, 2_000));
  worker = startWorker(kept.address, taskQueue);
  await waitForLine(worker, /worker: polling/, 120_000);
  say('a new worker picked the run up from its history');

  const summary: RunSummary = await handle.result();
  clearInterval(progress);
  void last;

  // --- the summary ------------------------------------------------------------------------------
  const calls = (await (await fetch(`${backend}/_ctl/calls`)).json()) as Array<{ capture_key: string; returned?: boolean }>;
  const continuedKeys = summary.recoveries.flatMap((r) => r.continuedSample);
  let savedCalls = 0;
  for (const key of continuedKeys) {
    const m = /^(.*)-a(\d+)$/.exec(key);
    if (!m) continue;
    const prev = Number(m[2]) - 1 === 0 ? m[1] : `${m[1]}-a${Number(m[2]) - 1}`;
    savedCalls += calls.filter((c) => c.capture_key === prev && c.returned).length;
  }
  const completedByRollout = new Map<string, number>();
  for await (const wf of client.workflow.list({ query: `WorkflowType = 'rolloutAttempt'` })) {
    if (!wf.workflowId.startsWith(`${runName}/rollout/`)) continue;
    if (wf.typedSearchAttributes.get(ROLLOUT_STATUS) !== 'completed') continue;
    const rollout = wf.workflowId.slice(`${runName}/rollout/`.length).replace(/-a\d+$/, '');
    completedByRollout.set(rollout, (completedByRollout.get(rollout) ?? 0) + 1);
  }
  const duplicates = [...completedByRollout.values()].filter((n) => n > 1).length;
  const failed = summary.checkpoints.filter((c) => c.outcome === 'failed');
  const out = {
    run: runName,
    steps: summary.steps,
    reward_per_step: summary.rewardPerStep.map((r) => Math.round(r * 1000) / 1000),
    policy_version: summary.trainerVersion,
    checkpoints_published: summary.checkpoints.filter((c) => c.outcome === 'completed' && c.snapshotDir).length,
    checkpoints_failed: failed.length,
    checkpoint_failure_reasons: failed.map((c) => c.reason),
    gym_crashes: 1,
    worker_crashes: 1,
    episodes_continued: summary.recoveries.reduce((n, r) => n + r.continued, 0),
    episodes_restarted: summary.recoveries.reduce((n, r) => n + r.restarted, 0),
    model_calls_saved_by_continuing: savedCalls,
    rollouts_completed: summary.completedRollouts,
    duplicate_completions: duplicates,
    recoveries: summary.recoveries.map((r) => ({ continued: r.continued, restarted: r.restarted, ...(r.error ? { error: r.error } : {}) })),
    temporal_ui: ui,
  };
  writeFileSync(join(demoDir, 'summary.json'), `${JSON.stringify(out, null, 2)}\n`);
  console.log('\n=== demo summary ===');
  console.log(`reward per step:        ${out.reward_per_step.join('  ')}`);
  console.log(
    `checkpoints published:  ${out.checkpoints_published} (failed: ${out.checkpoints_failed}${failed.length ? ` — ${out.checkpoint_failure_reasons.join(', ')}` : ''})`,
  );
  console.log(`crashes:                Gym ×${out.gym_crashes} (every process SIGKILLed), worker ×${out.worker_crashes}`);
  console.log(`after the Gym crash:    ${out.episodes_continued} episodes continued from their saved turn, ${out.episodes_restarted} restarted from input`);
  console.log(`model calls saved:      ${out.model_calls_saved_by_continuing} (made before the crash and not made again)`);
  for (const r of summary.recoveries.filter((x) => x.error)) console.log(`recovery error:         ${r.error}`);
  console.log(`rollouts completed:     ${out.rollouts_completed}, duplicate completions: ${out.duplicate_completions}`);
  console.log(`Temporal UI:            ${ui}`);
  console.log(`summary written to      ${join(demoDir, 'summary.json')}`);
  // The charts of the same run; a report that cannot be made does not undo the demo.
  await writeRunReport(client, runName, { out: join(demoDir, 'report.html') })
    .then(({ file }) => console.log(`run report (HTML):      ${file}`))
    .catch((err: unknown) => console.log(`run report failed:      ${(err as Error).message}`));
  // The same run in the Temporal UI (headless Chromium), while the worker still answers its queries.
  await screenshotRunInUi(client, { uiUrl: kept.uiUrl, run: runName, outDir: demoDir })
    .then((shots) => console.log(`Temporal UI screenshots: ${shots.map((s) => s.file).join(', ')}`))
    .catch((err: unknown) => console.log(`UI screenshots skipped: ${(err as Error).message.split('\n')[0]}`));

  await worker.stop(5_000);
  await downDeployment(gymDir);
  if (stop) await stop();
  else if (keep) say(`the dev server keeps running (pid ${kept.pid}); stop it with: kill ${kept.pid}`);
  process.exit(out.duplicate_completions === 0 && out.steps === 10 ? 0 : 1);
}

main().catch((err: unknown) => {
  console.error('[demo] failed:', err);
  process.exit(1);
});
