// A worker started while its Temporal server cannot be reached (not up yet, or restarting) retries
// its connection with backoff, logging each try, and starts polling once the server answers; with
// --connect-timeout-s it gives up with a clear message.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { freePort, startDevServer, type DevServer } from '../../scripts/temporal-dev.mjs';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const started: GroupProcess[] = [];
let server: DevServer | undefined;
let dir: string | undefined;

function worker(address: string, ...extra: string[]): GroupProcess {
  const proc = spawnGroup({
    command: process.execPath,
    args: [
      '--import',
      'tsx',
      join(ROOT, 'worker.ts'),
      '--address',
      address,
      '--task-queue',
      'connect-test',
      '--rollout-task-queue',
      'connect-test-run',
      ...extra,
    ],
    env: { ...process.env, GYM_CONTROL_TOKEN: 'connect-test-token' },
    cwd: ROOT,
  });
  started.push(proc);
  return proc;
}

afterAll(async () => {
  await Promise.all(started.map((p) => p.stop(3_000)));
  await server?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('worker start-up without a reachable Temporal server', () => {
  it('retries with backoff, logging each try, and polls once the server is up', async () => {
    const port = await freePort();
    const w = worker(`127.0.0.1:${port}`);
    const retry = await waitForLine(w, /worker: cannot reach Temporal at 127\.0\.0\.1:(\d+) \(try 2: .*\); retrying in ([\d.]+) s/, 60_000);
    expect(Number(retry[1])).toBe(port);
    expect(Number(retry[2])).toBe(1);
    dir = await mkdtemp(join(tmpdir(), 'worker-connect-'));
    server = await startDevServer({ port, headless: true, dbFile: join(dir, 'temporal.sqlite') });
    await waitForLine(w, /worker: polling connect-test and connect-test-run on 127\.0\.0\.1:\d+/, 60_000);
    expect(await Promise.race([w.exited.then(() => 'exited'), new Promise((r) => setTimeout(() => r('running'), 500))])).toBe('running');
  }, 120_000);

  it('gives up after --connect-timeout-s with a message naming the address', async () => {
    const port = await freePort();
    const w = worker(`127.0.0.1:${port}`, '--connect-timeout-s', '2');
    const lines: string[] = [];
    w.child.stderr?.on('data', (d: Buffer) => lines.push(d.toString()));
    expect(await w.exited).toBe(1);
    expect(lines.join('')).toContain(`worker: Temporal at 127.0.0.1:${port} did not answer within 2000 ms`);
  }, 60_000);
});
