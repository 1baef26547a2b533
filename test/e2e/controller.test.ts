// The controller on the real dev server against a real Gym deployment: a training run with
// periodic checkpoints; a worker process SIGKILLed in the middle of a checkpoint attempt; for each
// target level, every Gym process SIGKILLed with siblings sealed, parked mid-turn and unstarted;
// and a cold `restore_mode: latest` start of a new run on a copied checkpoint directory. A dev
// server killed and restarted mid-run is one of the fault-schedule seeds (test/e2e/chaos.test.ts).
// The turn-level run's report (`npm run report`) is opened in Chromium.
import { cp, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Client, type Connection, type WorkflowExecutionDescription } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTo } from '../helpers/temporal.js';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { RunConfigSchema, type RunConfig } from '../../protocol/run-config.js';
import { downDeployment, killDeployment, readEndpoints, restartDeployment, signalServers, upDeployment } from '../../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { startRun } from '../../scripts/run.js';
import { freePort, startDevServer, type DevServer } from '../../scripts/temporal-dev.mjs';
import { checkpointNow, runStatus } from '../../workflows/messages.js';
import { checkpointWorkflowId } from '../../workflows/checkpointAttempt.js';
import { outcomeOfFailure } from '../../workflows/checkpoint-outcome.js';
import { ROLLOUT_REWARD, ROLLOUT_STATUS, runQueries } from '../../workflows/search-attributes.js';
import { screenshotRunInUi } from '../../scripts/ui-screenshots.js';
import type { RunSummary } from '../../workflows/trainingRun.js';
import type { ReportData } from '../../scripts/report/data.js';
import { CHART_IDS } from '../../scripts/report/html.js';
import { checkPage } from '../../scripts/chromium.js';
import { runCommand } from '../helpers/cli.js';
import { sleep, waitFor } from '../helpers/wait.js';

const TOKEN = 'controller-e2e-token';
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const GYM_YAML = join(ROOT, 'examples/gym.yaml');

let dir: string;
let server: DevServer;
let connection: Connection;
let client: Client;
const workers: GroupProcess[] = [];

function startWorkerProcess(taskQueue: string, address = server.address, extraArgs: string[] = []): GroupProcess {
  const queues = ['--task-queue', taskQueue, '--rollout-task-queue', `${taskQueue}-run`];
  const proc = spawnGroup({
    command: process.execPath,
    args: ['--import', 'tsx', join(ROOT, 'worker.ts'), '--address', address, ...queues, ...extraArgs],
    env: { ...process.env, GYM_CONTROL_TOKEN: TOKEN },
    cwd: ROOT,
    onLine: (line) => {
      if (process.env.E2E_VERBOSE || /\bERROR\b|"level":50|Unhandled|Error:/.test(line)) console.log(`[worker ${taskQueue}] ${line.slice(0, 400)}`);
    },
  });
  workers.push(proc);
  return proc;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'controller-e2e-'));
  // With its Web UI: the turn-level test looks at its run there.
  server = await startDevServer({ port: await freePort(), uiPort: await freePort(), dbFile: join(dir, 'temporal.sqlite') });
  await upDeployment({ config: GYM_YAML, runDir: join(dir, 'gym'), env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' } });
  connection = await connectTo(server);
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
    // Some scenarios SIGKILL the worker under parked rollouts: their `/run`s are retried once this
    // heartbeat timeout (default 120 s) has passed.
    controller: { run_heartbeat_timeout_s: 15 },
    ...extra,
  });
}

async function metricsOf(cfg: RunConfig): Promise<CheckpointOutcome[]> {
  const text = await readFile(join(cfg.run.checkpoint_dir, 'checkpoint_metrics.jsonl'), 'utf8');
  return text
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as CheckpointOutcome);
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
    if (wf.typedSearchAttributes.get(ROLLOUT_STATUS) === 'completed') continue;
    const r = await client.workflow
      .getHandle(wf.workflowId)
      .result()
      .catch((e: unknown) => String(e));
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
    // one attempt workflow per rollout, each completed once (a child reports before its own
    // completion is recorded: give the last ones a moment to close)
    let rollouts = await rolloutWorkflows(cfg.run.name);
    for (let i = 0; i < 100 && [...rollouts.values()].some((st) => st.includes('RUNNING')); i++) {
      await sleep(100);
      rollouts = await rolloutWorkflows(cfg.run.name);
    }
    expect(rollouts.size).toBe(expected);
    for (const [key, statuses] of rollouts) expect(statuses, key).toEqual(['COMPLETED']);
    // the metrics file holds one line per attempt with stage seconds
    const metrics = await metricsOf(cfg);
    expect(metrics.length).toBe(summary.checkpoints.length);
    for (const m of metrics.filter((x) => x.outcome === 'completed')) {
      expect(m.seconds.prepare).toBeGreaterThan(0);
      expect(m.seconds.admission_closed_seconds).toBeGreaterThan(0);
    }
    // The worker's start (bundling its workflows) is in this test's time, up to 60 s on a loaded machine.
  }, 120_000);

  it('the control and the rollout worker as processes of their own (--only) finish a run with its checkpoints', async () => {
    const tq = 'e2e-split';
    const control = startWorkerProcess(tq, server.address, ['--only', 'control']);
    const rollouts = startWorkerProcess(tq, server.address, ['--only', 'rollouts']);
    await Promise.all([waitForLine(control, /worker: polling e2e-split on/, 60_000), waitForLine(rollouts, /worker: polling e2e-split-run on/, 60_000)]);
    const cfg = config('e2e-split', tq, {
      grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 4, max_num_steps: 3, tasksets: ['counter', 'weather'] },
    });
    const summary = await (await startRun(client, cfg)).result();
    expect(summary.steps).toBe(3);
    expect(summary.completedRollouts).toBe(3 * 2 * 4);
    expect(summary.failedRollouts).toBe(0);
    expect(summary.checkpoints.filter((c) => c.outcome === 'completed').length).toBeGreaterThanOrEqual(1);
    expect(summary.checkpoints.filter((c) => c.outcome === 'failed')).toEqual([]);
    // Each process polled only its own queue: the rollout attempts ran in the rollout process.
    const pollers = async (queue: string, type: 'workflow' | 'activity') =>
      (
        await client.workflowService.describeTaskQueue({
          namespace: 'default',
          taskQueue: { name: queue },
          taskQueueType: type === 'workflow' ? 1 : 2,
        })
      ).pollers ?? [];
    const identities = async (queue: string) => new Set([...(await pollers(queue, 'workflow')), ...(await pollers(queue, 'activity'))].map((p) => p.identity));
    const [controlIds, rolloutIds] = await Promise.all([identities(tq), identities(`${tq}-run`)]);
    expect(controlIds.size).toBeGreaterThan(0);
    expect(rolloutIds.size).toBeGreaterThan(0);
    for (const id of controlIds) expect(rolloutIds.has(id), id ?? '').toBe(false);
  }, 120_000);

  it('a worker SIGKILLed in the middle of a checkpoint attempt: a new worker finishes that attempt with the same ID', async () => {
    const tq = 'e2e-kill';
    const first = startWorkerProcess(tq);
    await waitForLine(first, /worker: polling/, 60_000);
    const cfg = config('e2e-kill', tq, { rollout_checkpointing: { snapshot_attempt_interval_s: 2, gym: { prepare_timeout_s: 30 } } });
    const handle = await startRun(client, cfg);
    // Kill the worker the moment the run starts a checkpoint attempt. An attempt lasts ~0.1-0.3 s
    // here, shorter than visibility takes to list it as running: the run's history is long-polled.
    const attemptId = await openChildOf(cfg.run.name, 'checkpointAttempt', 60_000);
    await first.kill();
    // The server starts the child from the run's command: give it a moment to exist.
    let statusWhileDown: WorkflowExecutionDescription | undefined;
    await waitFor(
      `${attemptId} to exist`,
      async () => {
        statusWhileDown = await client.workflow
          .getHandle(attemptId)
          .describe()
          .catch(() => undefined);
        return statusWhileDown !== undefined;
      },
      5_000,
    );
    expect(statusWhileDown!.status.name).toBe('RUNNING');

    const second = startWorkerProcess(tq);
    await waitForLine(second, /worker: polling/, 60_000);
    const progress = setInterval(() => {
      void handle
        .query(runStatus)
        .then((s) =>
          console.log(
            `[e2e-kill] ${s.phase} steps=${s.steps} inFlight=${s.inFlight} done=${s.completedRollouts} ckpts=${s.checkpoints.map((c) => c.reason).join(',')}`,
          ),
        )
        .catch(() => undefined);
    }, 5_000);
    const summary = await handle.result().finally(() => clearInterval(progress));
    expect(summary.steps).toBe(cfg.grpo.max_num_steps);
    // the interrupted attempt finished (same workflow ID = same checkpoint ID), exactly once
    const checkpointId = attemptId.slice(`${cfg.run.name}/checkpoint/`.length);
    const attempt = await client.workflow.getHandle(attemptId).result();
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

/**
 * The workflow ID of a child of `type` the workflow has started and not yet seen close, read from
 * its history as events arrive (a long poll: no visibility lag). Follows a continue-as-new.
 */
async function openChildOf(workflowId: string, type: string, timeoutMs: number): Promise<string> {
  const end = Date.now() + timeoutMs;
  const open = new Map<string, string>(); // initiated event ID → child workflow ID
  let token: Uint8Array | undefined;
  while (Date.now() < end) {
    const res = await client.workflowService.getWorkflowExecutionHistory({
      namespace: 'default',
      execution: { workflowId },
      nextPageToken: token,
      waitNewEvent: true,
    });
    for (const e of res.history?.events ?? []) {
      const started = e.startChildWorkflowExecutionInitiatedEventAttributes;
      if (started?.workflowType?.name === type && started.workflowId) open.set(String(e.eventId), started.workflowId);
      const closed =
        e.startChildWorkflowExecutionFailedEventAttributes ??
        e.childWorkflowExecutionCompletedEventAttributes ??
        e.childWorkflowExecutionFailedEventAttributes ??
        e.childWorkflowExecutionCanceledEventAttributes ??
        e.childWorkflowExecutionTimedOutEventAttributes ??
        e.childWorkflowExecutionTerminatedEventAttributes;
      if (closed?.initiatedEventId != null) open.delete(String(closed.initiatedEventId));
    }
    const first = open.values().next();
    if (!first.done) return first.value;
    // No token: the run closed (continued as new): read its successor from the start.
    if (res.nextPageToken?.length) token = res.nextPageToken;
    else {
      token = undefined;
      open.clear();
    }
  }
  throw new Error(`${workflowId} started no ${type} within ${timeoutMs} ms`);
}

// --- recovery ---------------------------------------------------------------------------------

async function post(url: string, body: unknown = {}): Promise<void> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`POST ${url}: ${r.status} ${await r.text()}`);
}

const backendUrl = (): string => readEndpoints(join(dir, 'gym')).policy_backend!.url;

/** SIGKILL every Gym process (the inference backend survives), let held calls go, start fresh ones. */
async function crashGym(): Promise<void> {
  await killDeployment(join(dir, 'gym'));
  await post(`${backendUrl()}/_ctl/release`);
  await restartDeployment(join(dir, 'gym'), { env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' } });
}

/** Completed attempt workflows of the run: rollout ID → [capture key, reward] of each. */
async function completedAttempts(run: string): Promise<Map<string, Array<{ key: string; reward: number | null }>>> {
  const out = new Map<string, Array<{ key: string; reward: number | null }>>();
  for await (const wf of client.workflow.list({ query: `WorkflowType = 'rolloutAttempt'` })) {
    if (!wf.workflowId.startsWith(`${run}/rollout/`)) continue;
    if (wf.typedSearchAttributes.get(ROLLOUT_STATUS) !== 'completed') continue;
    const key = wf.workflowId.slice(`${run}/rollout/`.length);
    const rollout = key.replace(/-a\d+$/, '');
    out.set(rollout, [...(out.get(rollout) ?? []), { key, reward: wf.typedSearchAttributes.get(ROLLOUT_REWARD) ?? null }]);
  }
  return out;
}

/** Every Gym participant's status: after a run, none may hold a retire mark or a restored episode. */
async function leftovers(): Promise<string[]> {
  const found: string[] = [];
  for (const [name, e] of Object.entries(readEndpoints(join(dir, 'gym')))) {
    if (e.kind === 'inference') continue;
    const r = await fetch(`${e.url}/ng-control/v1/checkpoint/status`, { headers: { authorization: `Bearer ${TOKEN}` } });
    if (r.status === 404) continue;
    const st = (await r.json()) as { phase: string; retired_rollouts: number; restored_pending?: string[] };
    if (st.retired_rollouts > 0) found.push(`${name}: ${st.retired_rollouts} retire marks`);
    if ((st.restored_pending ?? []).length > 0) found.push(`${name}: restored ${st.restored_pending!.join(',')}`);
    if (st.phase !== 'idle') found.push(`${name}: phase ${st.phase}`);
  }
  return found;
}

describe('recovery after every Gym process is SIGKILLed, per target level', () => {
  // Two groups (counter s1-p0, genrm s1-p1) of 4. g0 runs free (the counter g0 seals; the genrm g0
  // waits for its cohort in /verify), g1 and g2 park after their first model call (mid-turn), g3
  // parks before its first call (unstarted).
  const HOLDS = {
    rules: [
      { rollout_pattern: '\\.g[12](-a\\d+)?$', after_calls_per_rollout: 1 },
      { rollout_pattern: '\\.g3(-a\\d+)?$', after_calls_per_rollout: 0 },
    ],
  };

  for (const level of ['turn', 'sibling', 'prompt_group'] as const) {
    it(`${level}: sealed siblings ${level === 'prompt_group' ? 'rerun with their group' : 'are kept'}, parked ones ${level === 'turn' ? 'continue from their turn' : 'rerun'}, the genrm group re-forms and is scored once`, async () => {
      const name = `e2e-level-${level.replace('_', '-')}`;
      const worker = startWorkerProcess(name);
      await waitForLine(worker, /worker: polling/, 60_000);
      await post(`${backendUrl()}/_ctl/hold`, HOLDS);
      const cfg = config(name, name, {
        grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 4, max_num_steps: 1, tasksets: ['counter', 'genrm'] },
        // turn: a short prepare timeout, for the checkpoint that fails on a stopped server.
        rollout_checkpointing: { snapshot_attempt_interval_s: null, gym: { prepare_timeout_s: level === 'turn' ? 3 : 30 } },
        rollout_recovery: { target_level: level },
      });
      const handle = await startRun(client, cfg);
      const counter = `${name}.s1-p0`;
      const genrm = `${name}.s1-p1`;
      await waitFor('the counter g0 to seal', async () => (await handle.query(runStatus)).completedRollouts >= 1, 60_000);
      await sleep(1_500); // the held siblings reach their boundaries
      let failedId: string | undefined;
      if (level === 'turn') {
        // A participant that does not answer: the attempt fails (prepare timed out), its abort waits for the server.
        expect(signalServers(join(dir, 'gym'), { servers: ['restart_env'] }, 'SIGSTOP')).toEqual(['restart_env']);
        const failed = await handle.executeUpdate(checkpointNow).finally(() => signalServers(join(dir, 'gym'), { servers: ['restart_env'] }, 'SIGCONT'));
        expect(failed).toMatchObject({ outcome: 'failed', reason: 'io_error' });
        failedId = failed.checkpointId;
      }
      const saved = await handle.executeUpdate(checkpointNow);
      expect(saved.outcome).toBe('completed');
      expect(saved.scopeCount).toBe(7); // every unfinished sibling is parked at a boundary
      await crashGym();
      const summary: RunSummary = await handle.result();

      expect(summary.failedRollouts).toBe(0);
      expect(summary.completedRollouts).toBe(8);
      expect(summary.recoveries).toHaveLength(1);
      const rec = summary.recoveries[0]!;
      const parked = [1, 2, 3].map((g) => `${counter}.g${g}`);
      const cohort = [0, 1, 2, 3].map((g) => `${genrm}.g${g}`);
      // The recovery names each sibling by the attempt it goes on as (N+1).
      const next = (ids: string[]): string[] => ids.map((id) => `${id}-a1`).sort();
      if (level === 'turn') {
        expect(rec.restoreId).toMatch(/^restore-[0-9a-f]{32}$/);
        expect([...rec.continuedSample].sort()).toEqual(next([...parked, ...cohort]));
        expect(rec.continued).toBe(7);
        expect(rec.restarted).toBe(0);
      } else {
        expect(rec.continued).toBe(0);
        expect(rec.restarted).toBe(next([...parked, ...cohort, ...(level === 'prompt_group' ? [`${counter}.g0`] : [])]).length);
      }

      const done = await completedAttempts(name);
      expect(done.size).toBe(8);
      for (const [rollout, attempts] of done) {
        // prompt_group reruns the sealed sibling with its group: its first result is superseded.
        const expected = level === 'prompt_group' && rollout === `${counter}.g0` ? 2 : 1;
        expect(attempts, rollout).toHaveLength(expected);
        for (const a of attempts) expect(a.reward, a.key).not.toBeNull();
      }
      // The sealed sibling kept at turn and sibling: its one and only attempt is the first.
      if (level !== 'prompt_group') expect(done.get(`${counter}.g0`)!.map((a) => a.key)).toEqual([`${counter}.g0`]);
      // Parked siblings finish as the next attempt (turn: N+1 continued; otherwise a rerun).
      for (const id of parked) expect(done.get(id)![0]!.key, id).toMatch(/-a\d+$/);
      // The genrm cohort re-formed and was judged once: rewards in [0, 1], not the all-zero
      // placeholders of a judge failure or a cohort that never assembled.
      const judged = cohort.map((id) => done.get(id)![0]!.reward!);
      for (const r of judged) expect(r).toBeGreaterThanOrEqual(0);
      for (const r of judged) expect(r).toBeLessThanOrEqual(1);
      expect(
        judged.some((r) => r > 0),
        JSON.stringify(judged),
      ).toBe(true);
      expect((await leftovers()).join(' | ')).toBe('');
      if (level === 'turn') {
        await checkRunReport(name, summary);
        await checkSearchAttributes(name, summary, failedId!);
      }
    }, 180_000);
  }
});

/** The documented queries find each kind of workflow of a finished run, and the Temporal UI shows them (screenshots). */
async function checkSearchAttributes(run: string, summary: RunSummary, failedCheckpoint: string): Promise<void> {
  const q = runQueries(run);
  const ids = async (query: string): Promise<string[]> => {
    const out: string[] = [];
    for await (const wf of client.workflow.list({ query })) out.push(wf.workflowId);
    return out.sort();
  };
  const attempts = summary.checkpoints.filter((c) => c.checkpointId).map((c) => checkpointWorkflowId(run, c.checkpointId));
  // Visibility follows the histories by a moment.
  await waitFor(
    'every attempt in the visibility store',
    async () => (await ids(`${q.all} AND WorkflowType = 'checkpointAttempt'`)).length === attempts.length,
    20_000,
  );
  expect(await ids(q.failedCheckpoints)).toEqual([checkpointWorkflowId(run, failedCheckpoint)]);
  expect(await ids(`${q.all} AND CheckpointOutcome = 'completed'`)).toEqual(
    summary.checkpoints
      .filter((c) => c.outcome === 'completed')
      .map((c) => checkpointWorkflowId(run, c.checkpointId))
      .sort(),
  );
  expect(await ids(`${q.all} AND CheckpointReason = 'io_error'`)).toEqual([checkpointWorkflowId(run, failedCheckpoint)]);
  // The continued attempts are the ones the recovery named.
  expect(await ids(q.continuedAttempts)).toEqual(summary.recoveries[0]!.continuedSample.map((k) => `${run}/rollout/${k}`).sort());
  // The attempts they continue did not complete: the crash ended them.
  expect(await ids(q.unfinishedAttempts)).toEqual(summary.recoveries[0]!.continuedSample.map((k) => `${run}/rollout/${k.replace(/-a1$/, '')}`).sort());
  expect(await ids(`${q.all} AND WorkflowType = 'trainingRun' AND RunPhase = 'finished' AND TrainerStep = ${summary.steps}`)).toEqual([run]);
  // The failed attempt failed with its outcome as the failure's details.
  const err = await client.workflow
    .getHandle(checkpointWorkflowId(run, failedCheckpoint))
    .result()
    .catch((e: unknown) => e);
  expect(outcomeOfFailure((err as { cause?: unknown }).cause)).toMatchObject({ checkpointId: failedCheckpoint, outcome: 'failed', reason: 'io_error' });

  const shots = await screenshotRunInUi(client, { uiUrl: server.uiUrl!, run, outDir: join(ROOT, '.data/screenshots') });
  expect(shots.map((s) => s.name)).toEqual(['ui-run-workflows', 'ui-run', 'ui-failed-checkpoints', 'ui-checkpoint', 'ui-checkpoint-details']);
}

/** The report of a finished run, as `npm run report` writes it, in Chromium: every chart drawn, no error, no request. */
async function checkRunReport(run: string, summary: RunSummary): Promise<void> {
  const out = join(dir, `${run}.html`);
  const r = await runCommand('scripts/report.ts', [run, '--address', server.address, '--out', out]);
  expect(r.code, r.stderr).toBe(0);
  expect(r.stdout.trim()).toBe(out);
  const data = JSON.parse(/<script type="application\/json" id="report-data">(.*?)<\/script>/s.exec(await readFile(out, 'utf8'))![1]!) as ReportData;
  expect(data).toMatchObject({ state: 'completed', source: 'result', metrics: { found: true, duplicates: 0, otherRuns: 0 } });
  expect(data.recoveries.map((x) => [x.continued, x.restarted])).toEqual(summary.recoveries.map((x) => [x.continued, x.restarted]));
  expect(data.checkpoints.map((c) => [c.checkpointId, c.source])).toEqual(summary.checkpoints.map((c) => [c.checkpointId, 'metrics']));
  expect(data.timeline.completed.at(-1)!.n).toBe(summary.completedRollouts);
  const url = pathToFileURL(out).href;
  const page = await checkPage(url, { ready: 'document.body.dataset.charts !== undefined', screenshotTo: join(ROOT, '.data/screenshots/run-report.png') });
  expect(page.errors).toEqual([]);
  expect(page.requests).toEqual([url]);
  expect(page.canvases).toEqual(Object.fromEntries(CHART_IDS.map((id) => [id, true])));
}

describe('retention', () => {
  it('two snapshots under one anchor with keep_latest_k 1: the run deletes the older one after the newer one is out', async () => {
    const name = 'e2e-retention';
    const worker = startWorkerProcess(name);
    await waitForLine(worker, /worker: polling/, 60_000);
    // Every rollout parks after its first model call: the run stays at step 0 (one anchor).
    await post(`${backendUrl()}/_ctl/hold`, { rules: [{ rollout_pattern: `^${name}\\.`, after_calls_per_rollout: 1 }] });
    try {
      const cfg = config(name, name, {
        grpo: { num_prompts_per_step: 1, num_generations_per_prompt: 2, max_num_steps: 1, tasksets: ['counter'] },
        rollout_checkpointing: { snapshot_attempt_interval_s: null, keep_latest_k: 1, gym: { prepare_timeout_s: 30 } },
      });
      const handle = await startRun(client, cfg);
      await waitFor('both rollouts in flight', async () => (await handle.query(runStatus)).inFlight === 2, 60_000);
      await sleep(1_500); // they reach their boundaries
      const first = await handle.executeUpdate(checkpointNow);
      const second = await handle.executeUpdate(checkpointNow);
      expect([first.outcome, second.outcome]).toEqual(['completed', 'completed']);
      const root = dirname(second.snapshotDir!);
      expect(dirname(first.snapshotDir!)).toBe(root);
      // Applied by the run once it has the outcome (not before the update answers): wait for it.
      await waitFor('the older snapshot deleted', async () => (await readdir(root)).length === 1, 60_000);
      expect(await readdir(root)).toEqual([basename(second.snapshotDir!)]);
      await post(`${backendUrl()}/_ctl/release`);
      const summary: RunSummary = await handle.result();
      expect(summary).toMatchObject({ completedRollouts: 2, failedRollouts: 0 });
      expect(await readdir(root)).toEqual([basename(second.snapshotDir!)]);
    } finally {
      await post(`${backendUrl()}/_ctl/release`);
    }
  }, 120_000);
});

describe('a cold restore_mode: latest start', () => {
  it('a new run on a copied checkpoint directory takes over the newest anchor and its snapshot', async () => {
    const first = 'e2e-cold-a';
    const w1 = startWorkerProcess(first);
    await waitForLine(w1, /worker: polling/, 60_000);
    const trained = {
      grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 4, max_num_steps: 4, tasksets: ['counter', 'weather'] },
      trainer: { enabled: true },
      checkpointing: { enabled: true, save_period: 1 },
    };
    const cfgA = config(first, first, trained);
    const a = await startRun(client, cfgA);
    // Park everything after step 2's anchor and its snapshot, then lose the controller and Gym.
    await waitFor(
      'step 2 with its trainer-boundary snapshot',
      async () => {
        const s = await a.query(runStatus);
        if (process.env.E2E_VERBOSE)
          console.log(JSON.stringify({ steps: s.steps, ck: s.checkpoints.map((c) => [c.trigger, c.outcome, c.reason, c.snapshotDir]) }));
        return s.steps >= 2 && s.checkpoints.some((c) => c.trigger === 'trainer_boundary' && c.outcome === 'completed' && c.snapshotDir?.includes('step_2'));
      },
      120_000,
    );
    await post(`${backendUrl()}/_ctl/hold`, { after_calls_per_rollout: 1 });
    // The whole controller side is lost: the run and the attempts it started (they outlive it).
    await a.terminate('e2e: the controller is lost');
    for await (const wf of client.workflow.list({ query: `ExecutionStatus = 'Running'` })) {
      if (wf.workflowId.startsWith(`${first}/`))
        await client.workflow
          .getHandle(wf.workflowId)
          .terminate('e2e: the controller is lost')
          .catch(() => undefined);
    }
    await w1.stop(3_000);
    await crashGym();

    const copy = join(dir, 'cold-copy', 'checkpoints');
    await cp(cfgA.run.checkpoint_dir, copy, { recursive: true });
    const second = 'e2e-cold-b';
    const w2 = startWorkerProcess(second);
    await waitForLine(w2, /worker: polling/, 60_000);
    const cfgB = RunConfigSchema.parse({ ...config(second, second, trained), run: { ...config(second, second).run, checkpoint_dir: copy } });
    const summary: RunSummary = await (await startRun(client, cfgB)).result();

    expect(summary.restoredFrom).not.toBeNull();
    const from = summary.restoredFrom!;
    expect(from.anchor).toMatch(/^step_\d+$/);
    expect(from.step).toBeGreaterThanOrEqual(2);
    expect(from.anchor).toBe(`step_${from.step}`);
    // Steps whose groups were complete before the hold still train, so the run may be lost
    // after a newer anchor than step 2 and before that anchor's snapshot: then the anchor's
    // Gym-restart fallback marker (written with the anchor) is what the new run takes over.
    if (from.snapshotDir === null) {
      expect(await readFile(join(copy, from.anchor!, 'gym_restart_fallback.json'), 'utf8')).toContain(`"base_train_step": ${from.step}`);
    } else {
      expect(from.snapshotDir).toContain(join('cold-copy', 'checkpoints', from.anchor!));
    }
    expect(from.trainerVersion).toBe(from.step);
    // It goes on from the anchor: the remaining steps only, and the policy version follows.
    expect(summary.steps).toBe(4);
    expect(summary.trainerVersion).toBe(4);
    expect(summary.rewardPerStep).toHaveLength(4 - from.step);
    expect(summary.failedRollouts).toBe(0);
    expect(summary.recoveries).toHaveLength(1);
    expect((await leftovers()).join(' | ')).toBe('');
  }, 300_000);
});

describe('crashes of the controller side', () => {
  it('a trainer crash (its worker SIGKILLed) comes back from its newest anchor and redoes the steps after it', async () => {
    const name = 'e2e-trainer-crash';
    const first = startWorkerProcess(name);
    await waitForLine(first, /worker: polling/, 60_000);
    const cfg = config(name, name, {
      grpo: { num_prompts_per_step: 2, num_generations_per_prompt: 4, max_num_steps: 5, tasksets: ['counter', 'weather'] },
      trainer: { enabled: true },
      // Anchors every 2 steps: a crash after step 3 loses a step the trainer must redo from the ledger.
      checkpointing: { enabled: true, save_period: 2 },
    });
    const handle = await startRun(client, cfg);
    // Hold every model call once step 3 trained, so the kill lands between anchors (step_2 … step_4).
    await waitFor('step 3', async () => (await handle.query(runStatus)).steps >= 3, 120_000);
    await post(`${backendUrl()}/_ctl/hold`, { after_calls: 0 });
    const killedAt = (await handle.query(runStatus)).steps;
    await first.kill();
    const second = startWorkerProcess(name);
    const caughtUp = waitForLine(second, /trainer lost its state; replaying the batches after its anchor/, 120_000);
    await waitForLine(second, /worker: polling/, 60_000);
    await post(`${backendUrl()}/_ctl/release`);
    const summary: RunSummary = await handle.result();
    // Steps after the newest anchor must be redone from the batches the run kept.
    if (killedAt % 2 === 1) await caughtUp;
    else void caughtUp.catch(() => undefined);
    expect(summary.steps).toBe(5);
    // One policy version per step, none lost and none applied twice.
    expect(summary.trainerVersion).toBe(5);
    expect(summary.rewardPerStep).toHaveLength(5);
    expect(summary.failedRollouts).toBe(0);
    const done = await completedAttempts(name);
    expect(done.size).toBe(5 * 2 * 4);
    for (const [rollout, attempts] of done) expect(attempts, rollout).toHaveLength(1);
    const anchors = (await import('node:fs'))
      .readdirSync(cfg.run.checkpoint_dir)
      .filter((n) => n.startsWith('step_'))
      .sort();
    expect(anchors).toEqual(['step_2', 'step_4', 'step_5']);
  }, 240_000);
});
