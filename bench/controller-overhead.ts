// controller-overhead: the same rollouts run by a plain driver and through the Temporal
// controller, side by side in one process and on one Gym deployment.
//
//   npm run bench -- controller-overhead [--rollouts 1000] [--groups-in-flight 64] [--generations 4]
//                                        [--tasksets weather,counter] [--repeat 1] [--token-delay-ms 0]
//
// Plain: a script POSTs `/run` straight to the environment servers, at most --groups-in-flight
// prompt groups (of --generations siblings) unfinished at once, the next group starting when one
// finishes: the controller's own dispatch rule (`async_rl.max_in_flight_groups`).
// Controller: the Temporal dev server (SQLite file), the controller's workers in this process,
// one training run of 1 step covering every rollout, trainer and checkpointing off, no periodic
// snapshots. Both run the very same rollouts (IDs, tasks and environments as the controller's
// dataloader and ledger make them), so the model makes the same calls: between the phases every
// rollout is forgotten in Gym and the backend's call log is cleared.
// Floor: the same rollouts as the most trivial Temporal program runs them (bench/floor/): one
// workflow per rollout with one activity, its `/run`, under the same dispatch rule — Temporal's own
// cost, which the controller cannot go below.
// With --repeat 2 the phases run plain, floor, controller, controller, floor, plain (drift on a
// shared machine cancels out). Reported: wall time per phase, rollouts/s, the ratios controller /
// plain and controller / floor (medians), the controller's CPU per rollout (Temporal server and
// workers, beyond the plain driver's), and where the CPU went (Temporal server, this process =
// driver or workers, Gym).
// And where a rollout's time goes under the controller, from the histories of a sample of its
// rollout workflows (its start, first task, task queue, the `/run` itself, the report) and of
// the run (its workflow tasks: every dispatch and every report goes through them, one at a time).
// --token-delay-ms makes the backend wait per generated token: longer rollouts, the same work.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { Client, Connection, WorkflowNotFoundError } from '@temporalio/client';
import { defaultPayloadConverter } from '@temporalio/common';
import type { StartRolloutAttemptsInput } from '../activities/attempt-starts.js';
import { discover, forget } from '../activities/coordination.js';
import { createControlPool } from '../activities/control-client.js';
import { RunConfigSchema, type RunConfig } from '../protocol/run-config.js';
import { startRun } from '../scripts/run.js';
import { freePort, startDevServer, type DevServer } from '../scripts/temporal-dev.mjs';
import type { Endpoints } from '../servers/common/deployment.js';
import { downDeployment, upDeployment } from '../servers/launcher/launcher.js';
import { rolloutWorkflowId } from '../workflows/rolloutAttempt.js';
import { shardCount } from '../workflows/run/shards.js';
import { shardWorkflowId } from '../workflows/shard-id.js';
import { createControllerWorkers } from '../worker.js';
import { floorDriver, floorEpisodes, startFloorWorkers } from './floor/driver.js';
import { plannedGroups, type PlannedGroup } from './lib/planned-groups.js';
import { executions } from './lib/workflow-limits.js';
import { onExit } from './lib/cleanup.js';
import { eventMs, workflowTaskTimes } from './lib/history-timing.js';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';
import { Backend, TOKEN, groupCpuSeconds, gymCpuSeconds, gymYaml, limiter, newRunPool, postJson, type Reply } from './scale.js';

/**
 * The plain driver: every group's siblings POSTed at once, at most `inFlight` groups unfinished;
 * returns the `/run` replies (or errors) in group order.
 */
async function plainDriver(endpoints: Endpoints, groups: PlannedGroup[], inFlight: number): Promise<Array<Reply | Error>> {
  const pool = newRunPool();
  const out: Array<Reply | Error> = [];
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < groups.length) {
      const g = groups[next++]!;
      const url = `${endpoints[g.environment]!.url}/run`;
      const replies = await Promise.all(
        g.siblings.map((s) =>
          postJson(url, { episode_id: { rollout_id: s.rollout_id, attempt: 0 }, task: s.task }, pool).catch((err: unknown) => err as Error),
        ),
      );
      out.push(...replies);
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(inFlight, groups.length) }, lane));
  } finally {
    await pool.close();
  }
  return out;
}

/** Stage means (seconds) of a rollout's life in the controller, from Temporal histories. */
interface Lifecycle {
  /** Workflow tasks of the run, and their mean wait (scheduled → started) and run time (started → completed). */
  run_wf_tasks: number;
  run_wft_queued_s: number;
  run_wft_busy_s: number;
  sampled: number;
  /** Its shard asked for its start (the start activity scheduled) → the attempt's execution started. */
  start_s: number;
  /** Attempt started → its `/run` activity scheduled (the attempt's first workflow task). */
  first_task_s: number;
  /** Activity scheduled → picked up by the rollout worker (task queue latency). */
  queue_s: number;
  /** The `/run` itself (activity started → completed). */
  run_s: number;
  /** Activity completed → attempt completed (report signal to its shard, last workflow task). */
  report_s: number;
  /** Start asked → attempt completed. */
  total_s: number;
}

const tsMs = eventMs;

/** Up to `sample` rollout attempts of the run's shards, evenly spread, timed from their histories. */
async function lifecycle(client: Client, runName: string, shards: number, rolloutIds: readonly string[], sample: number): Promise<Lifecycle> {
  // The run's own workflow tasks: every dispatch and every report goes through one of them, in turn.
  const wft = { count: 0, queued: 0, busy: 0 };
  for (const h of await executions(client, runName)) {
    const times = workflowTaskTimes(h.events ?? []);
    wft.count += times.count;
    wft.queued += times.queuedMs;
    wft.busy += times.busyMs;
  }
  // The shards start the attempts, in batches by an activity (workflows/shard/dispatch.ts).
  const initiated = new Map<string, number>();
  for (let k = 0; k < shards; k++) {
    for (const h of await executions(client, shardWorkflowId(runName, k))) {
      for (const e of h.events ?? []) {
        const a = e.activityTaskScheduledEventAttributes;
        if (a?.activityType?.name !== 'startRolloutAttempts' || !a.input?.payloads?.[0]) continue;
        const batch = defaultPayloadConverter.fromPayload<StartRolloutAttemptsInput>(a.input.payloads[0]);
        for (const s of batch.starts) initiated.set(s.workflowId, tsMs(e.eventTime));
      }
    }
  }
  const step = Math.max(1, Math.floor(rolloutIds.length / sample));
  const acc = { start_s: 0, first_task_s: 0, queue_s: 0, run_s: 0, report_s: 0, total_s: 0 };
  let n = 0;
  for (let i = 0; i < rolloutIds.length && n < sample; i += step) {
    const id = rolloutWorkflowId(runName, { rollout_id: rolloutIds[i]!, attempt: 0 });
    const h = await client.workflow.getHandle(id).fetchHistory();
    const at: Record<string, number> = {};
    for (const e of h.events ?? []) {
      const t = tsMs(e.eventTime);
      if (e.workflowExecutionStartedEventAttributes) at.started = t;
      else if (e.activityTaskScheduledEventAttributes && at.scheduled === undefined) at.scheduled = t;
      else if (e.activityTaskStartedEventAttributes && at.activityStarted === undefined) at.activityStarted = t;
      else if (e.activityTaskCompletedEventAttributes && at.activityDone === undefined) at.activityDone = t;
      else if (e.workflowExecutionCompletedEventAttributes) at.done = t;
    }
    const asked = initiated.get(id);
    if (asked === undefined || Object.keys(at).length < 5) continue;
    acc.start_s += at.started! - asked;
    acc.first_task_s += at.scheduled! - at.started!;
    acc.queue_s += at.activityStarted! - at.scheduled!;
    acc.run_s += at.activityDone! - at.activityStarted!;
    acc.report_s += at.done! - at.activityDone!;
    acc.total_s += at.done! - asked;
    n += 1;
  }
  const f = (x: number): number => round3(n ? x / n / 1000 : 0);
  return {
    run_wf_tasks: wft.count,
    run_wft_queued_s: round3(wft.count ? wft.queued / wft.count / 1000 : 0),
    run_wft_busy_s: round3(wft.count ? wft.busy / wft.count / 1000 : 0),
    sampled: n,
    start_s: f(acc.start_s),
    first_task_s: f(acc.first_task_s),
    queue_s: f(acc.queue_s),
    run_s: f(acc.run_s),
    report_s: f(acc.report_s),
    total_s: f(acc.total_s),
  };
}

/**
 * Deletes a controller pass's workflows (the run, its shards, its attempts) so that the next pass
 * can run under the same IDs: an attempt ID never runs twice (`REJECT_DUPLICATE`), and the next
 * run's attempts would otherwise be taken as started already and never report.
 */
async function deletePass(client: Client, run: string, shards: number, rolloutIds: readonly string[]): Promise<void> {
  const ids = [
    run,
    ...Array.from({ length: shards }, (_, k) => shardWorkflowId(run, k)),
    ...rolloutIds.map((id) => rolloutWorkflowId(run, { rollout_id: id, attempt: 0 })),
  ];
  const gone = async (workflowId: string): Promise<boolean> => {
    try {
      await client.workflow.getHandle(workflowId).describe();
      return false;
    } catch (err) {
      if (err instanceof WorkflowNotFoundError) return true;
      throw err;
    }
  };
  const slot = limiter(32);
  let left = ids;
  for (let round = 0; left.length > 0; round++) {
    if (round === 60) throw new Error(`controller-overhead: ${left.length} workflows of the last pass were not deleted within a minute`);
    await Promise.all(
      left.map((workflowId) =>
        slot(() => client.workflowService.deleteWorkflowExecution({ namespace: 'default', workflowExecution: { workflowId } }).catch(() => undefined)),
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const still = await Promise.all(left.map((id) => slot(async () => ((await gone(id)) ? undefined : id))));
    left = still.filter((id): id is string => id !== undefined);
  }
}

interface CpuMark {
  temporal: number;
  self: number;
  gym: number;
}

async function cpuMark(server: DevServer, runDir: string): Promise<CpuMark> {
  const temporal = server.pid ? ((await groupCpuSeconds([server.pid])).get(server.pid) ?? 0) : 0;
  const u = process.cpuUsage();
  const gym = Object.values(await gymCpuSeconds(runDir)).reduce((a, b) => a + b, 0);
  return { temporal, self: (u.user + u.system) / 1e6, gym };
}

const cpuDelta = (a: CpuMark, b: CpuMark): CpuMark => ({ temporal: b.temporal - a.temporal, self: b.self - a.self, gym: b.gym - a.gym });

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rollouts: { type: 'string', default: '1000' },
      'groups-in-flight': { type: 'string', default: '64' },
      generations: { type: 'string', default: '4' },
      tasksets: { type: 'string', default: 'weather,counter' },
      repeat: { type: 'string', default: '1' },
      seed: { type: 'string', default: '1' },
      'token-delay-ms': { type: 'string', default: '0' },
    },
  });
  const generations = Number(values.generations);
  const groups = Math.max(1, Math.round(Number(values.rollouts) / generations));
  const rollouts = groups * generations;
  const inFlight = Number(values['groups-in-flight']);
  const repeat = Math.max(1, Number(values.repeat));
  const tasksets = values.tasksets!.split(',').map((s) => s.trim()) as RunConfig['grpo']['tasksets'];

  const dir = await mkdtemp(join(tmpdir(), 'bench-coverhead-'));
  const runDir = join(dir, 'gym');
  const env = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'error' };
  console.log(
    `controller-overhead: ${rollouts} rollouts (${groups} groups × ${generations}), ${inFlight} groups in flight, ` +
      `${values['token-delay-ms']} ms per generated token`,
  );
  // Worker state changes and the like are not part of the report.
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  const stopServer = onExit('the Temporal dev server', () => server.stop());
  const tokenDelayMs = Number(values['token-delay-ms']);
  await writeFile(join(dir, 'gym.yaml'), gymYaml({ tokenDelayMs }));
  const stopGym = onExit('the Gym deployment', () => downDeployment(runDir));
  const up = await upDeployment({ config: join(dir, 'gym.yaml'), runDir, env, healthTimeoutMs: 180_000 });
  const endpoints = up.endpoints;
  const backend = new Backend(endpoints.policy_backend!.url);
  const workers = await createControllerWorkers({ address: server.address, controlToken: TOKEN, taskQueue: 'overhead', rolloutTaskQueue: 'overhead-run' });
  const running = workers.run();
  const connection = await Connection.connect({ address: server.address });
  const client = new Client({ connection });

  const cfg = RunConfigSchema.parse({
    run: {
      name: 'overhead',
      gym_run_dir: runDir,
      checkpoint_dir: join(dir, 'checkpoints'),
      seed: Number(values.seed),
      task_queue: 'overhead',
      rollout_task_queue: 'overhead-run',
    },
    grpo: {
      num_prompts_per_step: groups,
      num_generations_per_prompt: generations,
      max_num_steps: 1,
      tasksets,
      environments: { weather: 'weather_env', counter: 'counter_env' },
    },
    async_rl: { max_in_flight_groups: inFlight },
    rollout_checkpointing: { snapshot_attempt_interval_s: null },
    trainer: { enabled: false },
    checkpointing: { enabled: false },
  });
  const planned = await plannedGroups(cfg, groups);
  const rolloutIds = planned.flatMap((g) => g.siblings.map((s) => s.rollout_id));

  /** Forget the rollouts in Gym (the environment drops its kept replies) and clear the call log. */
  const cleanSlate = async (ids: readonly string[] = rolloutIds): Promise<void> => {
    const servers = Object.entries(endpoints)
      .filter(([, e]) => e.kind !== 'inference')
      .map(([name, e]) => ({ name, url: e.url }));
    const pool = createControlPool();
    const dep = { token: TOKEN, pool, members: (await discover({ servers, token: TOKEN, pool })).members };
    for (let i = 0; i < ids.length; i += 1000) {
      await forget(dep, { deadlineTs: Date.now() / 1000 + 120, rolloutIds: ids.slice(i, i + 1000) });
    }
    await pool.close();
    await postJson(`${backend.url}/_ctl/reset`, {});
  };

  const rows: Row[] = [];
  const lifecycles: Lifecycle[] = [];
  const problems: string[] = [];
  const order: Array<'plain' | 'floor' | 'controller'> = [];
  for (let r = 0; r < repeat; r++) order.push(...(r % 2 === 0 ? (['plain', 'floor', 'controller'] as const) : (['controller', 'floor', 'plain'] as const)));
  const floorWorkers = await startFloorWorkers(server.address, TOKEN);
  const floorGroups = floorEpisodes(planned, cfg.run.name, endpoints);
  // Warm-up, not reported: a few groups each way (JIT of every server, the workers' first
  // workflow and activity tasks), under another run name.
  const warmCfg = RunConfigSchema.parse({
    ...cfg,
    run: { ...cfg.run, name: 'overhead-warm', checkpoint_dir: join(dir, 'checkpoints-warm') },
    grpo: { ...cfg.grpo, num_prompts_per_step: Math.min(4, groups) },
  });
  const warm = await plannedGroups(warmCfg, warmCfg.grpo.num_prompts_per_step);
  const warmIds = warm.flatMap((g) => g.siblings.map((s) => s.rollout_id));
  await plainDriver(endpoints, warm, inFlight);
  await cleanSlate(warmIds);
  const warmFloor = floorEpisodes(warm, 'overhead-warm', endpoints);
  await floorDriver(client, floorWorkers, warmFloor, inFlight);
  await cleanSlate(warmIds);
  await (await startRun(client, warmCfg)).result();
  await cleanSlate(warmIds);

  for (const [i, phase] of order.entries()) {
    // Outside the phase's time and CPU.
    if (phase === 'controller' && order.slice(0, i).includes('controller')) await deletePass(client, cfg.run.name, shardCount(cfg), rolloutIds);
    const before = await cpuMark(server, runDir);
    const t0 = performance.now();
    let completed = 0;
    let rewardSum = 0;
    let extra: Row = {};
    let tEnd: number | undefined;
    let after: CpuMark | undefined;
    if (phase === 'floor') {
      completed = await floorDriver(
        client,
        floorWorkers,
        floorGroups.map((g) => g.map((s) => ({ ...s, run: `floor-${i}` }))),
        inFlight,
      );
      tEnd = performance.now();
      after = await cpuMark(server, runDir);
    } else if (phase === 'plain') {
      const replies = await plainDriver(endpoints, planned, inFlight);
      for (const rep of replies) {
        if (!(rep instanceof Error) && rep.status === 200 && rep.body?.result) {
          completed += 1;
          rewardSum += rep.body.result.reward as number;
        } else problems.push(`plain: ${rep instanceof Error ? rep.message : `HTTP ${rep.status} ${JSON.stringify(rep.body).slice(0, 200)}`}`);
      }
    } else {
      const handle = await startRun(client, cfg);
      const summary = await handle.result();
      tEnd = performance.now();
      // Before reading histories back (that costs the server and us CPU too).
      after = await cpuMark(server, runDir);
      completed = summary.completedRollouts;
      rewardSum = (summary.rewardPerStep[0] ?? 0) * completed;
      if (summary.failedRollouts > 0) problems.push(`controller: ${summary.failedRollouts} failed rollout attempts`);
      const info = await handle.describe();
      // History length of the run's last execution (after any continue-as-new).
      extra = { history_events: Number(info.historyLength), continued_as_new: summary.continuedAsNew };
      lifecycles.push(await lifecycle(client, cfg.run.name, shardCount(cfg), rolloutIds, 200));
    }
    const wall = ((tEnd ?? performance.now()) - t0) / 1000;
    const cpu = cpuDelta(before, after ?? (await cpuMark(server, runDir)));
    const calls = await backend.calls();
    const tokens = calls.reduce((s, c) => s + (c.decoded_tokens ?? 0), 0);
    const total = cpu.temporal + cpu.self + cpu.gym;
    rows.push({
      run: i + 1,
      phase,
      rollouts: rollouts,
      completed,
      mean_reward: round3(completed ? rewardSum / completed : 0),
      model_calls: calls.length,
      wall_s: round3(wall),
      rollouts_per_s: round3(completed / wall),
      tokens_per_s: Math.round(tokens / wall),
      temporal_cpu_s: round3(cpu.temporal),
      process_cpu_s: round3(cpu.self),
      gym_cpu_s: round3(cpu.gym),
      temporal_cpu_share: round3(total ? cpu.temporal / total : 0),
      ...extra,
    });
    console.log(`  ${phase}: ${completed}/${rollouts} rollouts in ${round3(wall)} s, ${calls.length} model calls`);
    if (completed !== rollouts) problems.push(`${phase}: ${completed} of ${rollouts} rollouts completed`);
    await cleanSlate();
  }

  const wallOf = (p: string): number => median(rows.filter((r) => r.phase === p).map((r) => Number(r.wall_s)));
  const plainS = wallOf('plain');
  const controllerS = wallOf('controller');
  const floorS = wallOf('floor');
  const ratio = controllerS / plainS;
  const floorRatio = controllerS / floorS;
  const ctl = rows.filter((r) => r.phase === 'controller');
  const plain = rows.filter((r) => r.phase === 'plain');
  const floor = rows.filter((r) => r.phase === 'floor');
  /** Temporal server + this process beyond the plain driver's, per rollout (ms). */
  const cpuMsPerRollout = (phaseRows: Row[]): number =>
    ((median(phaseRows.map((r) => Number(r.temporal_cpu_s))) +
      median(phaseRows.map((r) => Number(r.process_cpu_s))) -
      median(plain.map((r) => Number(r.process_cpu_s)))) *
      1000) /
    rollouts;
  const temporalShare = median(ctl.map((r) => Number(r.temporal_cpu_share)));
  // The controller's extra CPU in this process (workflow + activity workers vs the plain driver).
  const workerExtra = median(ctl.map((r) => Number(r.process_cpu_s))) - median(plain.map((r) => Number(r.process_cpu_s)));
  console.log('');
  printTable(rows);
  console.log('\na rollout in the controller (means over sampled attempts, from their histories):');
  printTable(lifecycles.map((l, k) => ({ controller_run: k + 1, ...l })));
  const life = lifecycles[0];
  // Of a rollout's time under the controller, the part that is not its `/run`.
  const temporalTimeShare = life && life.total_s > 0 ? 1 - life.run_s / life.total_s : null;
  console.log(
    `\nratio controller / plain (wall, median): ${round3(ratio)}; controller / floor: ${round3(floorRatio)} (floor ${round3(floorS)} s)  —  ` +
      `controller CPU ${round3(cpuMsPerRollout(ctl))} ms per rollout (floor ${round3(cpuMsPerRollout(floor))} ms); Temporal server: ` +
      `${round3(temporalShare * 100)} % of all CPU in the controller phase; workers: +${round3(workerExtra)} CPU s over the plain driver`,
  );
  // Longer rollouts are another configuration: kept apart from the default's result.
  const file = writeBenchResult(
    tokenDelayMs > 0 ? `controller-overhead-token-delay-${tokenDelayMs}ms` : 'controller-overhead',
    {
      rollouts,
      token_delay_ms: tokenDelayMs,
      ratio: round3(ratio),
      floor_ratio: round3(floorRatio),
      controller_cpu_ms_per_rollout: round3(cpuMsPerRollout(ctl)),
      floor_cpu_ms_per_rollout: round3(cpuMsPerRollout(floor)),
      plain_s: round3(plainS),
      floor_s: round3(floorS),
      controller_s: round3(controllerS),
      plain_rollouts_per_s: round3(rollouts / plainS),
      controller_rollouts_per_s: round3(rollouts / controllerS),
      temporal_cpu_share: round3(temporalShare),
      temporal_time_share: temporalTimeShare === null ? null : round3(temporalTimeShare),
      worker_extra_cpu_s: round3(workerExtra),
    },
    [...rows, ...lifecycles.map((l) => ({ table: 'lifecycle', ...l }))],
  );
  console.log(`wrote ${file}`);

  await floorWorkers.stop();
  await connection.close();
  await workers.shutdown();
  await running;
  await stopGym();
  await stopServer();
  await rm(dir, { recursive: true, force: true });
  if (problems.length) {
    console.error(`controller-overhead: ${problems.length} problems:\n  ${problems.slice(0, 20).join('\n  ')}`);
    process.exit(1);
  }
  process.exit(0);
}

await main();
