// The fault-schedule command's smoke run in CI: two fixed seeds of `npm run chaos`, on the real
// parts (dev server on its own SQLite file, worker process, Gym deployment, training run), each
// checked by every check of scripts/chaos/checks.ts. Together they cover a double Gym crash and a
// dev-server restart, each in a checkpoint window. A worker killed in a checkpoint window has its
// own test (test/e2e/controller.test.ts), so it is not run a second time here (the suite's time);
// the campaigns (`npm run chaos -- --schedules 50`) draw every fault kind.
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gymServers, runSchedule } from '../../scripts/chaos/run-schedule.js';
import { describeFault, drawSchedule, type FaultKind } from '../../scripts/chaos/schedule.js';
import { ChaosWorld } from '../../scripts/chaos/world.js';

const SMOKE: Array<{ seed: number; kinds: FaultKind[]; covers: string }> = [
  { seed: 1086, kinds: ['gym_kill', 'gym_kill'], covers: 'Gym crashed twice: in a checkpoint window with model calls held, then at a training step' },
  { seed: 1172, kinds: ['temporal_restart'], covers: 'the dev server killed and restarted on its database in a checkpoint window' },
];

const controlToken = randomBytes(16).toString('hex');
let dir: string;
let world: ChaosWorld;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'chaos-smoke-'));
  // A worker that does not come up (CI once saw one print nothing for 180 s) is killed and started
  // again within the hook's time, its last lines printed.
  world = await ChaosWorld.start({ dir, controlToken, workerStartMs: 120_000, log: (line) => console.log(`[chaos] ${line}`) });
}, 300_000);

afterAll(async () => {
  await world?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('npm run chaos, two fixed seeds', () => {
  for (const { seed, kinds, covers } of SMOKE) {
    it(`seed ${seed}: ${covers}; every check holds`, async () => {
      const schedule = drawSchedule(seed, { servers: gymServers() });
      expect(schedule.faults.map((f) => f.kind)).toEqual(kinds);
      const r = await runSchedule(schedule, { world, dir: join(dir, `seed-${seed}`), controlToken, log: (line) => console.log(`[chaos ${seed}] ${line}`) });
      console.log(
        `[chaos ${seed}] ${r.seconds.toFixed(0)} s, recoveries ${r.recoveries}, continued ${r.continued}, restarted ${r.restarted}; ${r.injected.map(describeFault).join('; ')}`,
      );
      expect(r.violations).toEqual([]);
      // Every fault fired (none was left for after the run's end).
      expect(r.injected.map((f) => f.kind)).toEqual(kinds);
      if (kinds.includes('gym_kill')) expect(r.recoveries).toBeGreaterThanOrEqual(1);
    }, 420_000);
  }
});
