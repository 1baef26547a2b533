// The run hands its ledger to the local activity that writes the cut unpacked (workflows/trainingRun.ts):
// a local activity's input is never uploaded, so Temporal's 2 MiB payload limit does not apply. This
// checks that assumption against the SDK and a real dev server with a ledger well over 2 MiB.
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from '@temporalio/worker';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createActivities } from '../../activities/index.js';
import { allocateSnapshot } from '../../activities/snapshots.js';
import { createLocalEnv, type LocalEnv } from '../helpers/temporal.js';

let local: LocalEnv;
let dir: string;

beforeAll(async () => {
  local = await createLocalEnv();
  dir = await mkdtemp(join(tmpdir(), 'ledger-cut-size-'));
});

afterAll(async () => {
  await local?.teardown();
  if (dir) await rm(dir, { recursive: true, force: true });
});

it('a ledger cut of 16,000 episodes (over 2 MiB of JSON) goes through the local activity plain', async () => {
  const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap' });
  const worker = await Worker.create({
    connection: local.env.nativeConnection,
    taskQueue: 'ledger-cut-size',
    workflowsPath: new URL('./fixtures/ledger-cut-workflow.ts', import.meta.url).pathname,
    activities: createActivities({ controlToken: 'unused' }),
  });
  const cut = await worker.runUntil(
    local.env.client.workflow.execute('writeLargeLedgerCut', { taskQueue: 'ledger-cut-size', workflowId: 'ledger-cut-size', args: [loc.tmpDir, 16_000] }),
  );
  const written = await readFile(join(loc.tmpDir, 'ledger.json'));
  expect(written.length).toBeGreaterThan(2 * 1024 * 1024);
  expect(cut).toEqual({ bytes: written.length, sha256: createHash('sha256').update(written).digest('hex') });
}, 120_000);
