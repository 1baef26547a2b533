// `npm run chaos -- --schedules N --seed S [--dir DIR]`: randomized fault schedules against the
// real system. One dev server (its own SQLite file) and one worker for the whole command; per
// schedule a fresh Gym deployment and a short training run, faults drawn from seed S+i (Gym
// crashes, one server's crash or stall, worker and dev-server kills, manual checkpoints, held
// model calls, many aimed at checkpoint windows), then every check of scripts/chaos/checks.ts.
// One line per schedule; a failing seed reruns alone with `--seed <it> --schedules 1`. A schedule's
// directory (Gym logs, checkpoints) is kept when it failed, or always with --keep; worker.log and
// the dev server's database are in --dir.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { downDeployment } from '../servers/launcher/launcher.js';
import { gymServers, liveDeployments, runSchedule, type ScheduleResult } from './chaos/run-schedule.js';
import { describeFault, drawSchedule, FAULT_KINDS, type FaultKind } from './chaos/schedule.js';
import { ChaosWorld } from './chaos/world.js';
import { projectRoot } from './temporal-paths.mjs';

const USAGE = 'usage: npm run chaos -- [--schedules N] [--seed S] [--dir DIR] [--keep] [--workers W]';

function line(r: ScheduleResult): string {
  const faults = r.injected.map(describeFault).join('; ') || 'none fired';
  const head = `seed ${r.schedule.seed}  ${r.violations.length ? 'FAIL' : 'ok  '}  ${r.seconds.toFixed(0).padStart(3)}s  steps ${r.schedule.steps}`;
  const recov = `recoveries ${r.recoveries} continued ${r.continued} restarted ${r.restarted}  checkpoints ${r.checkpoints.completed}/${r.checkpoints.completed + r.checkpoints.failed}`;
  const notes = [...r.violations, ...r.recoveryErrors.map((e) => `(recovery could not restore: ${e})`)];
  return `${head}  ${recov}  faults: ${faults}${notes.length ? `\n    ${notes.join('\n    ')}` : ''}`;
}

export function summaryLine(results: ScheduleResult[]): string {
  const counts = Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>;
  for (const r of results) for (const f of r.injected) counts[f.kind] += 1;
  const crashes = (r: ScheduleResult): number => r.injected.filter((f) => f.kind === 'gym_kill' || f.kind === 'server_kill').length;
  const failed = results.filter((r) => r.violations.length > 0);
  return [
    `chaos: ${results.length} schedules, ${results.length - failed.length} held, ${failed.length} with violations${failed.length ? ` (seeds ${failed.map((r) => r.schedule.seed).join(', ')})` : ''}`,
    `faults ${FAULT_KINDS.map((k) => `${k} ${counts[k]}`).join(', ')}`,
    `Gym crashed twice or more in ${results.filter((r) => crashes(r) >= 2).length}`,
    `episodes continued ${results.reduce((n, r) => n + r.continued, 0)}, restarted ${results.reduce((n, r) => n + r.restarted, 0)}`,
  ].join('; ');
}

async function main(): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        schedules: { type: 'string', default: '10' },
        seed: { type: 'string', default: '1' },
        dir: { type: 'string', default: join(projectRoot, '.data', 'chaos') },
        keep: { type: 'boolean', default: false },
        workers: { type: 'string', default: '1' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (err) {
    console.error(`${(err as Error).message}\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const n = Number(values.schedules);
  const seed = Number(values.seed);
  const workers = Number(values.workers);
  if (!Number.isSafeInteger(n) || n < 1 || !Number.isSafeInteger(seed) || seed < 0 || !Number.isSafeInteger(workers) || workers < 1) {
    console.error(`--schedules and --workers must be integers ≥ 1 and --seed an integer ≥ 0\n${USAGE}`);
    return 2;
  }
  const controlToken = randomBytes(16).toString('hex');
  const log = (l: string): void => console.log(l);
  const dir = values.dir!;
  const world = await ChaosWorld.start({ dir, controlToken, log });
  // Interrupted: nothing of ours may run on (the Gym servers are detached process groups).
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      console.error(`chaos: ${sig}, stopping what is running`);
      void Promise.all([...liveDeployments].map((d) => downDeployment(d, { graceMs: 1_000 }).catch(() => undefined)))
        .then(() => world.close())
        .finally(() => process.exit(130));
    });
  }
  const servers = gymServers();
  const results: ScheduleResult[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const schedule = drawSchedule(seed + i, { servers, workers });
      const r = await runSchedule(schedule, { world, dir: join(dir, `seed-${schedule.seed}`), controlToken, log, keep: values.keep, workers });
      results.push(r);
      console.log(line(r));
    }
  } finally {
    // A schedule that threw (its run could not start…) left its Gym up: detached groups outlive us.
    await Promise.all([...liveDeployments].map((d) => downDeployment(d, { graceMs: 1_000 }).catch(() => undefined)));
    await world.close();
  }
  console.log(summaryLine(results));
  return results.every((r) => r.violations.length === 0) ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
