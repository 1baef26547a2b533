// controller-scale: N rollouts in flight through the Temporal controller on the dev server
// (Temporal's default limits), each parked at its first model call by a per-rollout backend hold;
// then K checkpoints through the controller, then release and let the run finish. Before it, on a
// fresh server, the floor: the same N rollouts as trivial one-activity workflows (bench/floor/).
//   npm run bench -- controller-scale [--rollouts 2000] [--rollouts 8000] [--checkpoints 5] [--no-floor] [--control-threads N] [--workers N] [--rollouts-per-shard N] [--rollout-worker-process]
// Prints the checkpoint attempt's stage seconds, the dispatch rate against the floor's, the
// busiest workflow against Temporal's default limits, and why attempts failed (if any did).
// Each checkpoint's line names the CPU seconds of every Gym server over it. Environment knobs:
// BENCH_GYM_PROFILE=<dir> (CPU profiles of the Gym processes, cut with the printed windows),
// BENCH_GYM_NODE_OPTIONS (Node options of the Gym processes, e.g. a preload), BENCH_KEEP_DIR=1
// (keep the run's directory: snapshots, server logs), BENCH_SHARD_TIMING=1 (the shards' side of each
// candidates stage, printed after the last checkpoint), BENCH_VERBOSE=1 (each attempt's events and
// the run's, fetched between checkpoints: this process is the controller's worker, so it loads the
// next checkpoint; not for figures).
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Client, Connection } from '@temporalio/client';
import { RunConfigSchema } from '../protocol/run-config.js';
import { startRun } from '../scripts/run.js';
import { freePort, startDevServer } from '../scripts/temporal-dev.mjs';
import { downDeployment, readEndpoints, upDeployment } from '../servers/launcher/launcher.js';
import { logPath, logTail } from '../servers/launcher/run-dir.js';
import { createControllerWorkers } from '../worker.js';
import { checkpointWorkflowId } from '../workflows/checkpointAttempt.js';
import { checkpointNow, runStatus } from '../workflows/messages.js';
import { onExit } from './lib/cleanup.js';
import { activityTimes, eventMs, eventType, workflowTaskTimes } from './lib/history-timing.js';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';
import { printShardTimings, shardTimings } from './lib/shard-timing.js';
import { limitsOf } from './lib/workflow-limits.js';
import { startRolloutWorkerProcess, type RolloutWorkerProcess } from './lib/rollout-worker.js';
import { failedAttempts } from './lib/failed-attempts.js';
import { plannedGroups } from './lib/planned-groups.js';
import { floorEpisodes, floorStart, startFloorWorkers } from './floor/driver.js';
import { shardCount } from '../workflows/run/shards.js';
import { shardWorkflowId } from '../workflows/rolloutShard.js';
import { gymCpuSeconds, processGroupCpuSeconds, profilesBeforeKill, sleep, writeProfiler } from './scale.js';

const TOKEN = 'bench-controller-scale';
/** The Gym deployment; `workers` > 1 runs the model, the agent and the environment server as that many worker processes each (docs/multi-worker.md). */
const gymYaml = (workers: number): string => {
  const w = workers > 1 ? `, workers: ${workers}` : '';
  return `checkpoint:
  enabled: true
  lease_grace_seconds: 600
servers:
  policy_backend: { kind: inference, options: { seed: 1 } }
  policy_model: { kind: model, options: { backend: policy_backend }${w} }
  simple_agent: { kind: agent, options: { model: policy_model, max_steps: 8 }${w} }
  weather: { kind: resources, type: weather }
  weather_env: { kind: environment, options: { agent: simple_agent, resources: weather }${w} }
`;
};

async function post(url: string, body: unknown): Promise<void> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
}

const PARKED_WINDOW_S = 10;

/**
 * Where the checkpoint attempt's time went outside its stages: from the update to the child's
 * start, the child's workflow tasks and activities waiting in the server's queues, and from the
 * child's end to the update's answer.
 */
async function checkpointTiming(client: Client, runWorkflowId: string, workflowId: string, askedAt: number, answeredAt: number): Promise<Row> {
  const events = (await client.workflow.getHandle(workflowId).fetchHistory()).events ?? [];
  const first = eventMs(events[0]?.eventTime);
  if (process.env.BENCH_VERBOSE) {
    for (const e of events) {
      console.log(`  ${(eventMs(e.eventTime) - first).toFixed(0).padStart(6)} ms  ${eventType(e)}`);
    }
  }
  const last = eventMs(events.at(-1)?.eventTime);
  if (process.env.BENCH_VERBOSE) {
    // The run's side of the same window: its workflow tasks, the signals it got and sent.
    // Best effort: a page of the run's history can pass the client's 4 MB message limit.
    const runEvents = await client.workflow
      .getHandle(runWorkflowId)
      .fetchHistory()
      .then((h) => h.events ?? [])
      .catch((err: unknown) => {
        console.log(`  run: history not readable (${String(err).slice(0, 120)})`);
        return [];
      });
    for (const e of runEvents) {
      const t = eventMs(e.eventTime);
      if (t < first - 100 || t > last + 100) continue;
      const name =
        e.workflowExecutionSignaledEventAttributes?.signalName ??
        e.signalExternalWorkflowExecutionInitiatedEventAttributes?.signalName ??
        e.activityTaskScheduledEventAttributes?.activityType?.name ??
        '';
      console.log(`  run ${(t - first).toFixed(0).padStart(6)} ms  ${eventType(e)} ${name}`);
    }
    // One shard's side: its workflow tasks and local activities while it answers the attempt.
    const shardEvents = await client.workflow
      .getHandle(shardWorkflowId(runWorkflowId, 0))
      .fetchHistory()
      .then((h) => h.events ?? [])
      .catch(() => []);
    for (const e of shardEvents) {
      const t = eventMs(e.eventTime);
      if (t < first - 100 || t > last + 100) continue;
      console.log(`  shard0 ${(t - first).toFixed(0).padStart(6)} ms  ${eventType(e)} ${e.workflowExecutionSignaledEventAttributes?.signalName ?? ''}`);
    }
  }
  const wft = workflowTaskTimes(events);
  let queued = 0;
  for (const t of activityTimes(events).values()) queued += t.queuedMs;
  return {
    ckpt_start_s: round3((first - askedAt) / 1000),
    ckpt_wf_tasks: wft.count,
    ckpt_wft_queued_s: round3(wft.queuedMs / 1000),
    ckpt_wft_busy_s: round3(wft.busyMs / 1000),
    ckpt_activity_queued_s: round3(queued / 1000),
    ckpt_answer_s: round3((answeredAt - last) / 1000),
  };
}

/** CPU seconds so far of the Gym's processes, the dev server's and this process's (the worker's threads among them). */
interface CpuReading {
  gym: number;
  byServer: Record<string, number>;
  server: number;
  bench: number;
  /** The rollout worker's process, with `--rollout-worker-process` (else 0). */
  rolloutWorker: number;
}

async function cpuNow(gymRunDir: string, serverPid: number, rolloutWorkerPid?: number): Promise<CpuReading> {
  const byServer = await gymCpuSeconds(gymRunDir);
  const gym = Object.values(byServer).reduce((a, b) => a + b, 0);
  const { user, system } = process.cpuUsage();
  const rolloutWorker = rolloutWorkerPid === undefined ? 0 : await processGroupCpuSeconds(rolloutWorkerPid);
  return { gym, byServer, server: await processGroupCpuSeconds(serverPid), bench: (user + system) / 1e6, rolloutWorker };
}

/** Each Gym server's CPU seconds between two readings, busiest first (`simple_agent 0.62, weather_env 0.41, …`). */
function gymCpuByServer(before: CpuReading, after: CpuReading): string {
  return Object.entries(after.byServer)
    .map(([name, s]) => [name, s - (before.byServer[name] ?? 0)] as const)
    .sort((a, b) => b[1] - a[1])
    .map(([name, s]) => `${name} ${s.toFixed(2)}`)
    .join(', ');
}

/** The stage figures of one checkpoint taken with every rollout parked. */
async function checkpointOnce(
  client: Client,
  handle: Awaited<ReturnType<typeof startRun>>,
  rollouts: number,
  attemptIds: string[],
  cpu: () => Promise<CpuReading>,
): Promise<Row> {
  const cpu0 = await cpu();
  const askedAt = Date.now();
  const askedUs = process.hrtime.bigint() / 1000n;
  const outcome = await handle.executeUpdate(checkpointNow);
  const answeredAt = Date.now();
  const cpu1 = await cpu();
  console.log(`  Gym CPU s by server over the checkpoint: ${gymCpuByServer(cpu0, cpu1)}`);
  // The window on the monotonic clock of a `--cpu-prof` profile (its timestamps, in µs).
  if (process.env.BENCH_SHARD_TIMING || process.env.BENCH_GYM_PROFILE)
    console.log(`  checkpoint window on the profile clock: ${askedUs} → ${process.hrtime.bigint() / 1000n} µs`);
  if (process.env.BENCH_GYM_NODE_OPTIONS) console.log(`  checkpoint window, epoch ms: ${askedAt} → ${answeredAt}`);
  attemptIds.push(checkpointWorkflowId(`scale-${rollouts}`, outcome.checkpointId));
  const attempt = await checkpointTiming(client, `scale-${rollouts}`, checkpointWorkflowId(`scale-${rollouts}`, outcome.checkpointId), askedAt, answeredAt);
  return {
    outcome: `${outcome.outcome}/${outcome.reason}`,
    exported: outcome.scopeCount ?? 0,
    allocate_s: round3(outcome.seconds.allocate ?? 0),
    candidates_s: round3(outcome.seconds.candidates ?? 0),
    prepare_s: round3(outcome.seconds.prepare ?? 0),
    commit_s: round3(outcome.seconds.commit ?? 0),
    ledger_cut_s: round3(outcome.seconds.ledger_cut ?? 0),
    publish_s: round3(outcome.seconds.publish ?? 0),
    resume_s: round3(outcome.seconds.resume ?? 0),
    checkpoint_s: round3(outcome.seconds.total ?? 0),
    admission_closed_s: round3(outcome.seconds.admission_closed_seconds ?? 0),
    // The machine's CPU over the checkpoint (ask to answer), by who used it.
    gym_cpu_s: round3(cpu1.gym - cpu0.gym),
    server_cpu_s: round3(cpu1.server - cpu0.server),
    bench_cpu_s: round3(cpu1.bench - cpu0.bench),
    rollout_worker_cpu_s: round3(cpu1.rolloutWorker - cpu0.rolloutWorker),
    ...attempt,
  };
}

/** A fresh dev server (Temporal's default limits, as a user's cluster has them) and Gym deployment, every rollout parked at its first model call. */
async function world(rollouts: number, tag: string, workers = 1) {
  const dir = await mkdtemp(join(tmpdir(), `bench-cscale-${tag}-${rollouts}-`));
  const server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  const stopServer = onExit('the Temporal dev server', () => server.stop());
  await writeFile(join(dir, 'gym.yaml'), gymYaml(workers));
  const stopGym = onExit('the Gym deployment', () => downDeployment(join(dir, 'gym')));
  // BENCH_GYM_PROFILE=<dir>: every Gym process is CPU-profiled; the profiles (to the release) are
  // written there after the checkpoints, to be cut with the windows the bench prints.
  const profileDir = process.env.BENCH_GYM_PROFILE;
  const gymNodeOptions = [
    process.env.NODE_OPTIONS ?? '',
    process.env.BENCH_GYM_NODE_OPTIONS ?? '',
    profileDir ? `--import ${await writeProfiler(dir, profileDir)}` : '',
  ]
    .join(' ')
    .trim();
  const gymNodeEnv = gymNodeOptions ? { NODE_OPTIONS: gymNodeOptions } : {};
  await upDeployment({ config: join(dir, 'gym.yaml'), runDir: join(dir, 'gym'), env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'error', ...gymNodeEnv } });
  const endpoints = readEndpoints(join(dir, 'gym'));
  const backend = endpoints.policy_backend!.url;
  // Every rollout parks at its first model call (the agent waits at the boundary before it).
  await post(`${backend}/_ctl/hold`, { after_calls_per_rollout: 0 });
  const connection = await Connection.connect({ address: server.address });
  return {
    server,
    endpoints,
    backend,
    client: new Client({ connection }),
    cfg: scaleConfig(rollouts, dir),
    gymRunDir: join(dir, 'gym'),
    dir,
    modelCalls: async () => ((await fetch(`${backend}/_ctl/call_count`).then((r) => r.json())) as { count: number }).count,
    async teardown() {
      await connection.close();
      await stopGym();
      await stopServer();
      if (process.env.BENCH_KEEP_DIR) console.log(`kept ${dir}`);
      else await rm(dir, { recursive: true, force: true });
    },
  };
}

function scaleConfig(rollouts: number, dir: string) {
  const generations = 4;
  const groups = rollouts / generations;
  return RunConfigSchema.parse({
    run: {
      name: `scale-${rollouts}`,
      gym_run_dir: join(dir, 'gym'),
      checkpoint_dir: join(dir, 'checkpoints'),
      task_queue: 'scale',
      rollout_task_queue: 'scale-run',
    },
    grpo: {
      num_prompts_per_step: groups,
      num_generations_per_prompt: generations,
      max_num_steps: 1,
      tasksets: ['weather'],
      environments: { weather: 'weather_env' },
    },
    async_rl: { max_in_flight_groups: groups },
    rollout_checkpointing: { snapshot_attempt_interval_s: null, gym: { prepare_timeout_s: 300 } },
    controller: { max_history_events: 40_000, ...(rolloutsPerShard === undefined ? {} : { rollouts_per_shard: rolloutsPerShard }) },
    trainer: { enabled: false },
    checkpointing: { enabled: false },
  });
}

/**
 * Temporal's floor for the same dispatch (bench/floor/): the same N rollouts as one-activity
 * workflows started by the bench (100 start calls at a time), each parked at its first model call
 * as the run's are; the seconds until they have called.
 */
async function floorDispatchSeconds(rollouts: number): Promise<number> {
  const w = await world(rollouts, 'floor');
  const workers = await startFloorWorkers(w.server.address, TOKEN, rollouts + 100);
  const episodes = floorEpisodes(await plannedGroups(w.cfg, w.cfg.grpo.num_prompts_per_step), w.cfg.run.name, w.endpoints).flat();
  const t0 = Date.now();
  const starting = floorStart(w.client, workers, episodes);
  // The floor's `/run`s have no ledger behind them: one that the environment server drops (its
  // descriptor ceiling) never parks. Counted as dispatched once 99.9 % parked and no more come.
  let parked = 0;
  let lastParkedAt = t0;
  for (;;) {
    const now = await w.modelCalls();
    if (now > parked) [parked, lastParkedAt] = [now, Date.now()];
    if (parked >= rollouts || (parked >= rollouts * 0.999 && Date.now() - lastParkedAt > 30_000)) break;
    if (Date.now() - t0 > 900_000) throw new Error(`floor: only ${parked} of ${rollouts} parked after 15 min`);
    await sleep(250);
  }
  const seconds = (lastParkedAt - t0) / 1000;
  if (parked < rollouts) console.log(`  floor: ${parked} of ${rollouts} parked (the rest dropped by Gym); timed to the last`);
  await starting;
  // The workers first: shutting down cancels the parked `/run`s (their heartbeats carry it).
  await Promise.race([workers.stop(), sleep(60_000)]);
  await w.teardown();
  return seconds;
}

async function runOnce(rollouts: number, checkpoints: number, withFloor: boolean, gymWorkers: number): Promise<Row> {
  const floorS = withFloor ? await floorDispatchSeconds(rollouts) : Number.NaN;
  const { server, endpoints, backend, client, cfg, modelCalls, teardown, gymRunDir, dir } = await world(rollouts, 'controller', gymWorkers);
  // --rollout-worker-process: the rollout worker in a process of its own (`npm run worker -- --only
  // rollouts`, its own default of slots: a `/run` hands itself to the run keeper at once), the
  // control worker here.
  const rolloutWorker: RolloutWorkerProcess | undefined = values['rollout-worker-process']
    ? await startRolloutWorkerProcess({
        address: server.address,
        taskQueue: 'scale',
        rolloutTaskQueue: 'scale-run',
        controlToken: TOKEN,
        logFile: join(dir, 'rollout-worker.log'),
      })
    : undefined;
  const workers = await createControllerWorkers({
    address: server.address,
    controlToken: TOKEN,
    taskQueue: 'scale',
    rolloutTaskQueue: 'scale-run',
    maxConcurrentRollouts: rollouts + 100,
    ...(rolloutWorker ? { only: 'control' as const } : {}),
    ...(controlThreads ? { controlWorkflowThreads: controlThreads } : {}),
  });
  const running = workers.run();
  const t0 = Date.now();
  const handle = await startRun(client, cfg);
  // Wait until every rollout is parked at its held second call.
  let dispatchedAt = 0;
  for (;;) {
    // The run may be too busy starting children to answer a query at once: try again.
    let queryError: unknown;
    const s = await handle.query(runStatus).catch((err: unknown) => void (queryError = err));
    const calls = await modelCalls();
    // Checked first: a run that never answers (e.g. its workflow task fails on every attempt) must not hang the bench.
    if (Date.now() - t0 > 900_000) {
      throw new Error(
        `only ${s ? s.inFlight : '?'} in flight, ${calls} calls after 15 min${s ? '' : ` (the run does not answer queries: ${String(queryError)})`}`,
      );
    }
    if (!s) {
      if (process.env.BENCH_VERBOSE) console.log(`  ${((Date.now() - t0) / 1000).toFixed(0)} s: no answer to the status query, ${calls} model calls`);
      await new Promise((r) => setTimeout(r, 1000));
      continue;
    }
    if (!dispatchedAt && s.inFlight >= rollouts) dispatchedAt = Date.now();
    if (s.inFlight >= rollouts && calls >= rollouts) break;
    if (process.env.BENCH_VERBOSE) console.log(`  ${((Date.now() - t0) / 1000).toFixed(0)} s: ${s.inFlight} in flight, ${calls} model calls, phase ${s.phase}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
  // The dev server's load while everything is parked (the heartbeats of N parked `/run`s).
  const cpu0 = await processGroupCpuSeconds(server.pid!);
  await sleep(PARKED_WINDOW_S * 1000);
  const parkedCores = ((await processGroupCpuSeconds(server.pid!)) - cpu0) / PARKED_WINDOW_S;
  const parkedAt = Date.now();
  // K checkpoints of the same parked rollouts, back to back (a machine shared with others makes
  // one sample noisy): the row holds the median one's stages, and every admission-closed time.
  const taken: Row[] = [];
  const attemptIds: string[] = [];
  for (let k = 0; k < checkpoints; k++) {
    if (k > 0) await sleep(2_000);
    // The wall clock, to line the checkpoint up with samples taken outside the bench.
    if (process.env.BENCH_VERBOSE) console.log(`  checkpoint ${k + 1}/${checkpoints} asked at ${new Date().toISOString()}`);
    const one = await checkpointOnce(client, handle, rollouts, attemptIds, () => cpuNow(gymRunDir, server.pid!, rolloutWorker?.pid));
    taken.push(one);
    // As it is taken: a run that fails later (in its finish) still leaves these.
    console.log(
      `  checkpoint ${k + 1}/${checkpoints}: ${String(one.outcome)}, admission closed ${String(one.admission_closed_s)} s ` +
        `(candidates ${String(one.candidates_s)}, prepare ${String(one.prepare_s)}, commit ${String(one.commit_s)}, ledger cut ${String(one.ledger_cut_s)}, ` +
        `publish ${String(one.publish_s)}, resume ${String(one.resume_s)}); ` +
        `CPU s over the checkpoint (${String(one.checkpoint_s)} s): Gym ${String(one.gym_cpu_s)}, dev server ${String(one.server_cpu_s)}, bench ${String(one.bench_cpu_s)}` +
        (rolloutWorker ? `, rollout worker ${String(one.rollout_worker_cpu_s)}` : ''),
    );
  }
  if (process.env.BENCH_SHARD_TIMING) {
    const attempts = await Promise.all(
      attemptIds.map((id) =>
        client.workflow
          .getHandle(id)
          .fetchHistory()
          .then((h) => h.events ?? []),
      ),
    );
    for (const [k, timings] of (await shardTimings(client, `scale-${rollouts}`, shardCount(cfg), attempts)).entries()) {
      console.log(`  checkpoint ${k + 1}/${checkpoints}, the shards' candidates (ms from the attempt's start):`);
      printShardTimings(timings);
    }
  }
  if (process.env.BENCH_GYM_PROFILE) await profilesBeforeKill(gymRunDir, process.env.BENCH_GYM_PROFILE);
  await post(`${backend}/_ctl/release`, {});
  const releasedAt = Date.now();
  const byAdmission = [...taken].sort((a, b) => Number(a.admission_closed_s) - Number(b.admission_closed_s));
  const median = byAdmission[Math.floor((byAdmission.length - 1) / 2)]!;
  // The finish, as it goes (a query the busy run may not answer at once: then the next one).
  const progress = process.env.BENCH_VERBOSE
    ? setInterval(() => {
        void handle
          .query(runStatus)
          .then((s) =>
            console.log(
              `  finish ${((Date.now() - releasedAt) / 1000).toFixed(0)} s: ${s.completedRollouts} completed, ${s.failedRollouts} failed, ${s.inFlight} in flight`,
            ),
          )
          .catch(() => undefined);
      }, 30_000)
    : undefined;
  const summary = await handle.result().finally(() => clearInterval(progress));
  const finishedAt = Date.now();
  const info = await handle.describe();
  // The run, its shards and its checkpoint attempts against Temporal's default limits.
  const ids = [cfg.run.name, ...Array.from({ length: shardCount(cfg) }, (_, k) => shardWorkflowId(cfg.run.name, k)), ...attemptIds];
  const limits = await limitsOf(client, ids);
  // Why attempts failed (each was retried): read from the server before it goes. Only when the
  // run counted failures: right after a fast finish the workflow list still shows thousands of
  // completed attempts as running (visibility catches up after the histories).
  const none = { listed: 0, read: 0, reasons: [] };
  const failed =
    summary.failedRollouts === 0
      ? none
      : await failedAttempts(client, cfg.run.name).catch((err: unknown) => {
          console.log(`  failed attempts: not readable (${String(err).slice(0, 200)})`);
          return none;
        });
  if (failed.listed > 0) {
    console.log(`  failed attempts: ${failed.listed} listed, ${failed.read} read; their reasons:`);
    for (const [reason, n] of failed.reasons.slice(0, 15)) console.log(`    ${String(n).padStart(5)}  ${reason}`);
    // The servers run at LOG_LEVEL=error: what their logs hold is why.
    for (const name of Object.keys(endpoints)) {
      const tail = logTail(logPath(gymRunDir, name), 0, 20);
      if (tail !== '(empty)' && tail !== '(no log)') console.log(`  ${name}'s log, last lines:\n${tail.replace(/^/gm, '    ')}`);
    }
  }
  const row: Row = {
    rollouts,
    ...median,
    outcome: new Set(taken.map((t) => t.outcome)).size === 1 ? String(median.outcome) : taken.map((t) => t.outcome).join(' '),
    checkpoints,
    gym_workers: gymWorkers,
    admission_closed_each_s: taken.map((t) => Number(t.admission_closed_s).toFixed(3)).join(' '),
    dispatch_s: round3((dispatchedAt - t0) / 1000),
    dispatch_per_s: round3(rollouts / ((dispatchedAt - t0) / 1000)),
    floor_dispatch_s: round3(floorS),
    floor_dispatch_per_s: round3(rollouts / floorS),
    parked_s: round3((parkedAt - t0) / 1000),
    server_cores_parked: round3(parkedCores),
    finish_s: round3((finishedAt - parkedAt) / 1000),
    completed: summary.completedRollouts,
    // Failed attempts (each retried as the next attempt, within the attempt budget).
    failed_attempts: summary.failedRollouts,
    history_events: Number(info.historyLength),
    continued_as_new: summary.continuedAsNew,
    shards: shardCount(cfg),
    max_pending_children: limits.maxPendingChildren,
    max_pending_activities: limits.maxPendingActivities,
    max_signals_per_s: round3(limits.maxSignalsPerS),
    busiest_workflow: limits.busiest,
    max_payload_bytes: limits.maxPayloadBytes,
    largest_payload: limits.largestPayloadIn,
  };
  await workers.shutdown();
  await running;
  await rolloutWorker?.stop();
  await teardown();
  return row;
}

const { values } = parseArgs({
  options: {
    rollouts: { type: 'string', multiple: true, default: ['2000'] },
    checkpoints: { type: 'string', default: '1' },
    // For profiling the controller alone: the figures' floor columns are then NaN.
    'no-floor': { type: 'boolean', default: false },
    // The control worker's workflow threads (worker.ts default when not given).
    'control-threads': { type: 'string' },
    // The model, agent and environment server as N worker processes each (the floor keeps one).
    workers: { type: 'string', default: '1' },
    // The rollout worker (the attempts and their parked `/run`s) as a process of its own.
    'rollout-worker-process': { type: 'boolean', default: false },
    // `controller.rollouts_per_shard` (the run config's default when not given).
    'rollouts-per-shard': { type: 'string' },
  },
});
const rolloutsPerShard = values['rollouts-per-shard'] === undefined ? undefined : Number(values['rollouts-per-shard']);
const controlThreads = values['control-threads'] === undefined ? undefined : Number(values['control-threads']);
const checkpoints = Number(values.checkpoints);
if (!Number.isInteger(checkpoints) || checkpoints < 1) throw new Error(`--checkpoints must be a positive integer, got ${values.checkpoints}`);
const rows: Row[] = [];
for (const n of values.rollouts!.map(Number)) {
  console.log(`controller-scale: ${n} rollouts in flight, ${checkpoints} checkpoint(s) …`);
  rows.push(await runOnce(n, checkpoints, !values['no-floor'], Number(values.workers)));
  printTable(rows);
}
const last = rows[rows.length - 1]!;
const file = writeBenchResult(
  'controller-scale',
  {
    in_flight: Number(last.rollouts),
    checkpoint_s: Number(last.checkpoint_s),
    admission_closed_s: Number(last.admission_closed_s),
    dispatch_per_s: Number(last.dispatch_per_s),
    floor_dispatch_per_s: Number(last.floor_dispatch_per_s),
    admission_closed_median_s: Number(last.admission_closed_s),
    max_pending_children: Number(last.max_pending_children),
    max_signals_per_s: Number(last.max_signals_per_s),
    max_payload_bytes: Number(last.max_payload_bytes),
  },
  rows,
);
console.log(`wrote ${file}`);
process.exit(0);
