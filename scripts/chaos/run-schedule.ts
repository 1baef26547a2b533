// One fault schedule end to end: a fresh Gym deployment (examples/gym.yaml with a token delay, so
// episodes last several turns), a short training run on the world's dev server and worker, the
// schedule's faults fired at their moments, then every check of checks.ts over what is left.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { WorkflowHandle } from '@temporalio/client';
import { parseDocument } from 'yaml';
import { validateSnapshot } from '../../activities/snapshots.js';
import { RunConfigSchema, type RunConfig } from '../../protocol/run-config.js';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { downDeployment, killDeployment, readEndpoints, restartDeployment, signalServers, upDeployment } from '../../servers/launcher/launcher.js';
import { ServerEntrySchema } from '../../servers/common/deployment.js';
import { groupAlive } from '../../servers/launcher/group-liveness.js';
import { loadServerModule } from '../../servers/registry.js';
import { readRunState } from '../../servers/launcher/run-dir.js';
import { runtimeDirOf, workerPid } from '../../servers/workers/spawn-workers.js';
import { checkpointNow, runStatus } from '../../workflows/messages.js';
import { ROLLOUT_REWARD, ROLLOUT_STATUS } from '../../workflows/search-attributes.js';
import type { RunSummary, trainingRun } from '../../workflows/trainingRun.js';
import { startRun } from '../run.js';
import { projectRoot } from '../temporal-paths.mjs';
import {
  checkCompletions,
  checkModelCalls,
  checkParticipants,
  checkRetention,
  type AnchorListing,
  type CompletedAttempt,
  type ModelCall,
  type ParticipantStatus,
} from './checks.js';
import { describeFault, type Fault, type Schedule } from './schedule.js';
import { CHAOS_TASK_QUEUE, delay, Serial, type ChaosWorld } from './world.js';

export const PROMPTS_PER_STEP = 4;
export const GENERATIONS_PER_PROMPT = 4;
/** Per generated token: a model call takes a few hundred ms, an episode a few seconds. */
export const TOKEN_DELAY_MS = 80;
const KEEP_LATEST_K = 2;
/** A run that has not finished this long after its last fault healed is a violation. */
const FINISH_TIMEOUT_MS = 300_000;
/**
 * A fault's moment (a step, a checkpoint window) that has not come this long after it was armed
 * fires the fault anyway: a run held up (in a recovery, behind held model calls) must not hold the
 * schedule up for ever, and the run's own finish is bounded above.
 */
const TRIGGER_WAIT_MS = 60_000;

/** Gym run dirs of deployments that are up (the command stops them when it is interrupted). */
export const liveDeployments = new Set<string>();

export interface ScheduleResult {
  schedule: Schedule;
  violations: string[];
  /** Faults that fired (a fault whose moment never came before the run ended does not). */
  injected: Fault[];
  continued: number;
  restarted: number;
  recoveries: number;
  /** Why a recovery could not restore (its unfinished work then started over): worth a look, not a violation. */
  recoveryErrors: string[];
  checkpoints: { completed: number; failed: number };
  /** Each checkpoint ID's last outcome (of the run's last kept outcomes). */
  checkpointOutcomes: Record<string, CheckpointOutcome['outcome']>;
  seconds: number;
}

export interface ScheduleOptions {
  world: ChaosWorld;
  dir: string;
  controlToken: string;
  log: (line: string) => void;
  /** Keep the schedule's directory (Gym logs, checkpoints) even when it held. */
  keep?: boolean;
  /** Worker processes of every Gym server (`workers:` in the deployment; 1 = one process each). */
  workers?: number;
}

/** examples/gym.yaml with a token delay on the tiny-policy backend (and `workers: N` on every Gym server that may have them). */
async function writeDeployment(file: string, workers: number): Promise<void> {
  const doc = parseDocument(readFileSync(join(projectRoot, 'examples/gym.yaml'), 'utf8'));
  doc.setIn(['servers', 'policy_backend', 'options', 'token_delay_ms'], TOKEN_DELAY_MS);
  if (workers > 1) {
    const servers = (doc.toJS() as { servers: Record<string, unknown> }).servers;
    for (const name of gymServers()) {
      const mod = await loadServerModule(name, ServerEntrySchema.parse(servers[name]));
      if (!mod.singleProcess) doc.setIn(['servers', name, 'workers'], workers);
    }
  }
  writeFileSync(file, doc.toString());
}

/** The Gym servers a fault may hit: every server but the inference backend. */
export function gymServers(): string[] {
  const doc = parseDocument(readFileSync(join(projectRoot, 'examples/gym.yaml'), 'utf8')).toJS() as { servers: Record<string, { kind: string }> };
  return Object.entries(doc.servers)
    .filter(([, s]) => s.kind !== 'inference')
    .map(([name]) => name);
}

function runConfig(schedule: Schedule, dir: string): RunConfig {
  return RunConfigSchema.parse({
    run: {
      name: `chaos-${schedule.seed}`,
      gym_run_dir: join(dir, 'gym'),
      checkpoint_dir: join(dir, 'checkpoints'),
      task_queue: CHAOS_TASK_QUEUE,
      rollout_task_queue: `${CHAOS_TASK_QUEUE}-run`,
      seed: schedule.seed,
    },
    grpo: {
      num_prompts_per_step: PROMPTS_PER_STEP,
      num_generations_per_prompt: GENERATIONS_PER_PROMPT,
      max_num_steps: schedule.steps,
      tasksets: ['counter', 'weather', 'genrm'],
    },
    async_rl: { max_in_flight_groups: 8, rollout_timeout_s: 600 },
    checkpointing: { enabled: true, save_period: 1 },
    rollout_checkpointing: { snapshot_attempt_interval_s: 3, keep_latest_k: KEEP_LATEST_K, gym: { prepare_timeout_s: 30 } },
    rollout_recovery: { target_level: 'turn' },
    // A killed worker's `/run`s are retried once their heartbeat timeout has passed.
    controller: { run_heartbeat_timeout_s: 10 },
  });
}

async function post(url: string, body: unknown = {}): Promise<void> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`POST ${url}: ${r.status} ${await r.text()}`);
}

export async function runSchedule(schedule: Schedule, opts: ScheduleOptions): Promise<ScheduleResult> {
  const started = Date.now();
  const { world, dir } = opts;
  rmSync(dir, { recursive: true, force: true });
  const gymDir = join(dir, 'gym');
  const env = { GYM_CONTROL_TOKEN: opts.controlToken, LOG_LEVEL: 'warn' };
  const deployment = join(dir, 'gym.yaml');
  mkdirSync(dir, { recursive: true });
  await writeDeployment(deployment, opts.workers ?? 1);
  liveDeployments.add(gymDir);
  await upDeployment({ config: deployment, runDir: gymDir, env });
  const backend = readEndpoints(gymDir).policy_backend!.url;
  const gymSteps = new Serial();
  const violations: string[] = [];
  const injected: Fault[] = [];
  const healing: Promise<unknown>[] = [];
  const racing: Promise<unknown>[] = [];
  const cfg = runConfig(schedule, dir);
  world.workerFailure = undefined;

  const handle = await startRun(world.client, cfg);
  let summary: RunSummary | undefined;
  let runError: unknown;
  const finished = handle.result().then(
    (s) => (summary = s),
    (err: unknown) => (runError = err),
  );
  const over = (): boolean => summary !== undefined || runError !== undefined;

  const restartGym = (servers?: string[]): Promise<unknown> =>
    gymSteps.run(async () => {
      for (let tries = 0; ; tries++) {
        try {
          return await restartDeployment(gymDir, { env, ...(servers ? { servers } : {}) });
        } catch (err) {
          if (tries >= 2) {
            violations.push(`the harness could not restart Gym: ${(err as Error).message.split('\n')[0]}`);
            return undefined;
          }
          await delay(2_000);
        }
      }
    });

  const inject = async (f: Fault): Promise<void> => {
    switch (f.kind) {
      case 'gym_kill':
        await gymSteps.run(() => killDeployment(gymDir));
        healing.push(delay(f.downMs).then(() => restartGym()));
        return;
      case 'server_kill':
        await gymSteps.run(async () => {
          if (f.worker === undefined) await killDeployment(gymDir, { servers: [f.server!] });
          else await killWorker(gymDir, f.server!, f.worker);
        });
        healing.push(delay(f.downMs).then(() => restartGym([f.server!])));
        return;
      case 'server_stop':
        await gymSteps.run(async () => signalServers(gymDir, { servers: [f.server!] }, 'SIGSTOP'));
        healing.push(delay(f.downMs).then(() => gymSteps.run(async () => signalServers(gymDir, { servers: [f.server!] }, 'SIGCONT'))));
        return;
      case 'worker_kill':
        healing.push(world.restartWorker(f.downMs));
        return;
      case 'report_kill':
        // Held model calls let no episode end: the calls go on, and the worker dies at the next
        // completed reports. Waits for the kill itself: the next fault counts from that moment.
        if (f.holdAfterCalls !== undefined) await post(`${backend}/_ctl/release`).catch(() => undefined);
        if (await world.killAfterSignal('report', TRIGGER_WAIT_MS)) healing.push(world.restartWorker(f.downMs));
        else opts.log(`  no completed report went out within ${TRIGGER_WAIT_MS / 1000} s: the worker was left running`);
        return;
      case 'cut_kill':
      case 'release_kill': {
        // A checkpoint at once, so its candidates request (or its release) comes soon: the worker
        // dies right after it sent it (held model calls stay held: the checkpoint comes anyway).
        const trigger = f.kind === 'cut_kill' ? 'cut' : 'release';
        const checkpoint = (): void => void racing.push(handle.executeUpdate(checkpointNow).catch(() => undefined));
        const what = trigger === 'cut' ? 'candidates request' : 'release';
        if (await world.killAfterSignal(trigger, TRIGGER_WAIT_MS, { checkpointDir: cfg.run.checkpoint_dir, onArmed: checkpoint })) {
          healing.push(world.restartWorker(f.downMs));
        } else opts.log(`  no checkpoint sent its ${what} within ${TRIGGER_WAIT_MS / 1000} s: the worker was left running`);
        return;
      }
      case 'temporal_restart':
        healing.push(world.restartTemporal(f.downMs));
        return;
      case 'manual_checkpoint':
        racing.push(handle.executeUpdate(checkpointNow).catch(() => undefined));
        return;
    }
  };

  try {
    for (const f of schedule.faults) {
      if (over()) break;
      if (f.holdAfterCalls !== undefined) await post(`${backend}/_ctl/hold`, { after_calls_per_rollout: f.holdAfterCalls }).catch(() => undefined);
      const fired = await triggered(f, handle, world, over);
      if (fired && !over()) {
        injected.push(f);
        opts.log(`  fault ${describeFault(f)}`);
        await inject(f);
      }
      if (f.holdAfterCalls !== undefined) await post(`${backend}/_ctl/release`).catch(() => undefined);
    }
    await Promise.all(healing);
    const timedOut = await Promise.race([finished.then(() => false), delay(FINISH_TIMEOUT_MS).then(() => true)]);
    if (timedOut) {
      const status = await handle.query(runStatus).catch(() => undefined);
      violations.push(
        `the run did not finish within ${FINISH_TIMEOUT_MS / 1000} s of the last fault (${status ? `${status.phase}, step ${status.steps}, ${status.inFlight} in flight` : 'no status'})`,
      );
      await handle.terminate('chaos: did not finish').catch(() => undefined);
      // Its attempts outlive it (ABANDON): they must not run on into the next schedule.
      for await (const wf of world.client.workflow.list({ query: `WorkflowId STARTS_WITH '${cfg.run.name}/' AND ExecutionStatus = 'Running'` })) {
        await world.client.workflow
          .getHandle(wf.workflowId)
          .terminate('chaos: the run did not finish')
          .catch(() => undefined);
      }
    }
    await Promise.all(racing);
    await world.settle();
    if (world.workerFailure) violations.push(world.workerFailure);
    if (runError !== undefined) violations.push(`the run failed: ${describeError(runError)}`);
    if (summary && summary.steps !== schedule.steps) violations.push(`the run trained ${summary.steps} steps, not ${schedule.steps}`);
    violations.push(...(await checkEverything(schedule, cfg, opts, summary)));
  } finally {
    await post(`${backend}/_ctl/release`).catch(() => undefined);
    await downDeployment(gymDir, { graceMs: 2_000 }).catch(() => undefined);
    liveDeployments.delete(gymDir);
  }
  const recs = summary?.recoveries ?? [];
  const cps: CheckpointOutcome[] = summary?.checkpoints ?? [];
  if (violations.length === 0 && !opts.keep) rmSync(dir, { recursive: true, force: true });
  return {
    schedule,
    violations,
    injected,
    continued: recs.reduce((n, r) => n + r.continued, 0),
    restarted: recs.reduce((n, r) => n + r.restarted, 0),
    recoveries: recs.length,
    recoveryErrors: recs.flatMap((r) => (r.error ? [r.error.slice(0, 300)] : [])),
    checkpoints: { completed: cps.filter((c) => c.outcome === 'completed').length, failed: cps.filter((c) => c.outcome === 'failed').length },
    checkpointOutcomes: Object.fromEntries(cps.map((c) => [c.checkpointId, c.outcome])),
    seconds: (Date.now() - started) / 1000,
  };
}

/** Whether the fault's moment came (false: the run ended first). */
async function triggered(f: Fault, handle: WorkflowHandle<typeof trainingRun>, world: ChaosWorld, over: () => boolean): Promise<boolean> {
  const t = f.trigger;
  if (t.on === 'time' || t.on === 'checkpoint') {
    const end = Date.now() + t.afterMs;
    while (Date.now() < end) {
      if (over()) return false;
      await delay(Math.min(100, end - Date.now()));
    }
    if (t.on === 'time') return true;
  }
  const armedAt = Date.now();
  const late = (): boolean => Date.now() - armedAt > TRIGGER_WAIT_MS;
  if (t.on === 'step') {
    while (!over() && !late()) {
      const s = await handle.query(runStatus).catch(() => undefined);
      if (s && s.steps >= t.step) return true;
      await delay(200);
    }
    return !over();
  }
  const opened = await nextCheckpointAttempt(handle.workflowId, world, () => over() || late());
  if (opened) await delay(t.delayMs);
  return !over();
}

/**
 * Resolves true when the run starts a checkpoint attempt after this call, read from the run's
 * history as events arrive (a long poll; visibility lags behind attempts of a few hundred ms).
 */
async function nextCheckpointAttempt(workflowId: string, world: ChaosWorld, over: () => boolean): Promise<boolean> {
  const armed = Date.now();
  let token: Uint8Array | undefined;
  while (!over()) {
    let res;
    try {
      res = await world.client.workflowService.getWorkflowExecutionHistory({
        namespace: 'default',
        execution: { workflowId },
        nextPageToken: token,
        waitNewEvent: true,
      });
    } catch {
      await delay(500); // the dev server may be down: it comes back
      continue;
    }
    for (const e of res.history?.events ?? []) {
      const at = Number(e.eventTime?.seconds ?? 0) * 1000 + Math.floor((e.eventTime?.nanos ?? 0) / 1e6);
      if (at >= armed && e.startChildWorkflowExecutionInitiatedEventAttributes?.workflowType?.name === 'checkpointAttempt') return true;
    }
    // No token: that execution closed (continued as new, or the run ended): read the newest one.
    token = res.nextPageToken?.length ? res.nextPageToken : undefined;
    if (!token) await delay(100);
  }
  return false;
}

function describeError(err: unknown): string {
  let e = err as { message?: string; cause?: unknown } | undefined;
  const parts: string[] = [];
  while (e && parts.length < 4) {
    if (e.message) parts.push(e.message);
    e = e.cause as typeof e;
  }
  return parts.join(': ').slice(0, 500);
}

async function checkEverything(schedule: Schedule, cfg: RunConfig, opts: ScheduleOptions, summary: RunSummary | undefined): Promise<string[]> {
  const out: string[] = [];
  const run = cfg.run.name;
  const { world } = opts;
  // Attempts report before they close: give the last ones a moment.
  let attempts = await listAttempts(world, run);
  for (let i = 0; i < 300 && attempts.running > 0; i++) {
    await delay(200);
    attempts = await listAttempts(world, run);
  }
  if (attempts.running > 0) out.push(`${attempts.running} attempt workflows still running after the run ended`);
  const expected = schedule.steps * PROMPTS_PER_STEP * GENERATIONS_PER_PROMPT;
  out.push(...checkCompletions(expected, attempts.started, attempts.completed));
  if (summary && summary.completedRollouts !== expected) out.push(`the run counted ${summary.completedRollouts} completed rollouts, expected ${expected}`);

  const endpoints = readEndpoints(cfg.run.gym_run_dir);
  const calls = (await (await fetch(`${endpoints.policy_backend!.url}/_ctl/calls`)).json()) as ModelCall[];
  out.push(...checkModelCalls(calls));

  const statuses: ParticipantStatus[] = [];
  for (const [name, e] of Object.entries(endpoints)) {
    if (e.kind === 'inference') continue;
    const r = await fetch(`${e.url}/ng-control/v1/checkpoint/status`, { headers: { authorization: `Bearer ${opts.controlToken}` } }).catch(
      (err: unknown) => err as Error,
    );
    if (r instanceof Error) {
      out.push(`${name}: status unreachable (${r.message})`);
      continue;
    }
    const st = (await r.json()) as { phase: string; retired_rollouts: number; restored_pending?: string[]; report?: { counts?: Record<string, number> } };
    statuses.push({ name, phase: st.phase, retired_rollouts: st.retired_rollouts, restored_pending: st.restored_pending, counts: st.report?.counts ?? {} });
  }
  out.push(...checkParticipants(statuses));

  const anchors = listAnchors(cfg.run.checkpoint_dir);
  for (const a of anchors) {
    for (const s of a.snapshots) {
      const snapshotDir = join(cfg.run.checkpoint_dir, a.anchor, 'rollout_snapshots', s);
      await validateSnapshot({ dir: snapshotDir }).catch((err: unknown) =>
        out.push(`${a.anchor}/${s} does not validate: ${(err as Error).message.slice(0, 300)}`),
      );
    }
  }
  out.push(...checkRetention(anchors, cfg.rollout_checkpointing.keep_latest_k));
  return out;
}

function listAnchors(checkpointDir: string): AnchorListing[] {
  if (!existsSync(checkpointDir)) return [];
  return readdirSync(checkpointDir, { withFileTypes: true })
    .filter((e) => e.isDirectory() && (e.name === 'bootstrap' || /^step_\d+$/.test(e.name)))
    .map((e) => {
      const root = join(checkpointDir, e.name, 'rollout_snapshots');
      const snapshots = existsSync(root)
        ? readdirSync(root)
            .filter((n) => /^snapshot_\d{6,}$/.test(n))
            .sort()
        : [];
      return { anchor: e.name, durable: existsSync(join(checkpointDir, e.name, 'trainer.json')), snapshots };
    });
}

async function listAttempts(world: ChaosWorld, run: string): Promise<{ running: number; started: Set<string>; completed: Map<string, CompletedAttempt[]> }> {
  const prefix = `${run}/rollout/`;
  const started = new Set<string>();
  const completed = new Map<string, CompletedAttempt[]>();
  let running = 0;
  for await (const wf of world.client.workflow.list({ query: `WorkflowId STARTS_WITH '${run}/'` })) {
    if (wf.status.name === 'RUNNING') running += 1;
    if (!wf.workflowId.startsWith(prefix)) continue;
    const key = wf.workflowId.slice(prefix.length);
    const rollout = key.replace(/-a\d+$/, '');
    started.add(rollout);
    const attrs = wf.typedSearchAttributes;
    if (attrs.get(ROLLOUT_STATUS) === 'completed')
      completed.set(rollout, [...(completed.get(rollout) ?? []), { key, reward: attrs.get(ROLLOUT_REWARD) ?? null }]);
  }
  return { running, started, completed };
}

/** SIGKILL one worker of a multi-worker server; its front takes the rest of the server down with it. */
async function killWorker(gymDir: string, server: string, index: number): Promise<void> {
  const front = readRunState(gymDir).servers[server]?.pid ?? undefined;
  // A server that runs as one process (a group-scored verifier) is killed whole.
  if (front !== undefined && runtimeDirOf(front) === undefined) return void (await killDeployment(gymDir, { servers: [server] }));
  const pid = front === undefined ? undefined : workerPid(front, index);
  if (front === undefined || pid === undefined) return; // already down (another fault got there first)
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  for (let waited = 0; groupAlive(front, server) && waited < 10_000; waited += 50) await delay(50);
}
