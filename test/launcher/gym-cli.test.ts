// The `gym` CLI: `up` returns while the servers keep running (they are detached and outlive it);
// `status` and `down` work from a later, separate invocation.
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { groupAlive } from '../../servers/launcher/group-liveness.js';
import { downDeployment } from '../../servers/launcher/launcher.js';
import { hasRunState, readRunState } from '../../servers/launcher/run-dir.js';
import { tempDir } from '../helpers/temp-dir.js';

const TSX = fileURLToPath(new URL('../../node_modules/.bin/tsx', import.meta.url));
const GYM = fileURLToPath(new URL('../../scripts/gym.ts', import.meta.url));
const run = promisify(execFile);

const tmp = tempDir('gym-cli', 'file');
const runDir = join(tmp, 'run');
const config = join(tmp, 'gym.yaml');
writeFileSync(config, 'servers:\n  policy_backend: { kind: inference }\n  policy_model: { kind: model, options: { backend: policy_backend } }\n');

const gym = (...args: string[]) => run(TSX, [GYM, ...args], { env: { ...process.env, LOG_LEVEL: 'warn' }, timeout: 60_000 });

afterAll(async () => {
  if (hasRunState(runDir)) await downDeployment(runDir, { graceMs: 1_000 }).catch(() => {});
});

describe('gym CLI', () => {
  it('up exits leaving the servers running; status and down work from later invocations', async () => {
    const up = await gym('up', config, '--dir', runDir);
    expect(up.stdout).toMatch(/^name\s+kind\s+url$/m);
    expect(up.stdout).toMatch(/^policy_model\s+model\s+http:\/\/127\.0\.0\.1:\d+$/m);
    const endpoints = JSON.parse(readFileSync(join(runDir, 'endpoints.json'), 'utf8')) as Record<string, { kind: string; url: string }>;
    expect(endpoints.policy_backend!.kind).toBe('inference');

    const status = await gym('status', runDir);
    expect(status.stdout).toMatch(/^policy_backend\s+inference\s+\S+\s+\d+\s+alive\s+healthy$/m);
    expect(status.stdout).toMatch(/^policy_model\s+model\s+\S+\s+\d+\s+alive\s+healthy$/m);

    const state = readRunState(runDir);
    await gym('down', runDir);
    for (const [name, s] of Object.entries(state.servers)) expect(groupAlive(s.pid, name), name).toBe(false);
  });

  it('a config error exits 2 naming the key', async () => {
    const bad = join(tmp, 'bad.yaml');
    writeFileSync(bad, 'servers:\n  m: { kind: model, options: { backend: b, checkpoint_polcy: true } }\n');
    const err = (await gym('up', bad, '--dir', join(tmp, 'bad-run')).catch((e: unknown) => e)) as { code: number; stderr: string };
    expect(err.code).toBe(2);
    expect(err.stderr).toContain('config error: servers.m.options.checkpoint_polcy');
  });
});
