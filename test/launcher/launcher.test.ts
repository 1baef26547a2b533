// The launcher with real processes: a small deployment (inference backend, policy model, one
// resources server) brought up, crashed with SIGKILL, restarted on the same ports, stopped.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError } from '../../servers/common/config-error.js';
import { groupAlive } from '../../servers/launcher/group-liveness.js';
import {
  downDeployment,
  killDeployment,
  LaunchError,
  readEndpoints,
  restartDeployment,
  SERVER_V8_FLAGS,
  statusDeployment,
  upDeployment,
} from '../../servers/launcher/launcher.js';
import { hasRunState, readRunState } from '../../servers/launcher/run-dir.js';
import { tempDir } from '../helpers/temp-dir.js';

const TOKEN = 'launcher-test-token';
const ENV = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' };

const tmp = tempDir('gym-launcher', 'file');
const runDir = join(tmp, 'run');
const config = join(tmp, 'gym.yaml');
writeFileSync(
  config,
  `checkpoint: { enabled: true }
servers:
  policy_backend: { kind: inference, options: { seed: 1 } }
  policy_model: { kind: model, options: { backend: policy_backend } }
  weather: { kind: resources, type: weather }
`,
);

/** Whether a process is running (a zombie is not). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0]!);
  } catch {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }
}

const pids = (): Record<string, number> => Object.fromEntries(Object.entries(readRunState(runDir).servers).map(([n, s]) => [n, s.pid!]));

async function getJson(url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const res = await request(url, { headers });
  const text = await res.body.text();
  return { status: res.statusCode, body: text ? JSON.parse(text) : undefined };
}

async function chat(modelUrl: string, key: string): Promise<{ status: number; body: any }> {
  const res = await request(`${modelUrl}/ng-rollout/${key}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'How is the weather in SF?\n[task weather city=SF]' }] }),
  });
  return { status: res.statusCode, body: await res.body.json() };
}

const refused = async (url: string): Promise<boolean> =>
  request(`${url}/healthz`).then(
    async (r) => {
      await r.body.dump();
      return false;
    },
    () => true,
  );

beforeAll(async () => {
  await upDeployment({ config, runDir, env: ENV, healthTimeoutMs: 60_000 });
});

afterAll(async () => {
  if (hasRunState(runDir)) await downDeployment(runDir, { graceMs: 1_000 }).catch(() => {});
});

describe('launcher (real processes)', () => {
  it('up: writes endpoints.json, the deployment copy and state, and every server is healthy', async () => {
    const endpoints = readEndpoints(runDir);
    expect(Object.keys(endpoints)).toEqual(['policy_backend', 'policy_model', 'weather']);
    expect(endpoints.policy_model!.kind).toBe('model');
    for (const e of Object.values(endpoints)) expect(e.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(readFileSync(join(runDir, 'deployment.yaml'), 'utf8')).toBe(readFileSync(config, 'utf8'));
    expect(existsSync(join(runDir, 'logs', 'policy_model.log'))).toBe(true);
    const status = await statusDeployment(runDir);
    expect(status.every((s) => s.alive && s.healthy)).toBe(true);
    for (const pid of Object.values(pids())) expect(running(pid)).toBe(true);
    // Each server process runs with the launcher's V8 flags (its workers inherit them).
    for (const [name, pid] of Object.entries(pids())) {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      for (const flag of SERVER_V8_FLAGS) expect(argv, name).toContain(flag);
    }

    // The servers found each other through endpoints.json: model → inference under the prefix.
    const r = await chat(endpoints.policy_model!.url, 'wx-1');
    expect(r.status).toBe(200);
    expect(r.body.ng_policy.situation).toBe('weather:calls=0');
    // GYM_CONTROL_TOKEN reached the servers: the resources participant's control plane accepts it.
    const st = await getJson(`${endpoints.weather!.url}/ng-control/v1/checkpoint/status`, { authorization: `Bearer ${TOKEN}` });
    expect(st.status).toBe(200);
  });

  it('up refuses a run dir whose servers are still running', async () => {
    await expect(upDeployment({ config, runDir, env: ENV })).rejects.toThrow(/has running servers/);
  });

  it('kill: SIGKILLs every Gym process group; the inference backend survives', async () => {
    const before = pids();
    const endpoints = readEndpoints(runDir);
    const killed = await killDeployment(runDir);
    expect(killed.sort()).toEqual(['policy_model', 'weather']);
    expect(running(before.policy_model!)).toBe(false);
    expect(running(before.weather!)).toBe(false);
    expect(await refused(endpoints.policy_model!.url)).toBe(true);
    expect(running(before.policy_backend!)).toBe(true);
    const status = Object.fromEntries((await statusDeployment(runDir)).map((s) => [s.name, s]));
    expect(status.policy_backend).toMatchObject({ alive: true, healthy: true });
    expect(status.policy_model).toMatchObject({ alive: false, healthy: false });
  });

  it('restart: fresh Gym processes on the same ports, the running inference backend kept', async () => {
    const before = pids();
    const endpoints = readEndpoints(runDir);
    const d = await restartDeployment(runDir, { env: ENV, healthTimeoutMs: 60_000 });
    expect(d.endpoints).toEqual(endpoints);
    expect(readEndpoints(runDir)).toEqual(endpoints);
    const after = pids();
    expect(after.policy_backend).toBe(before.policy_backend);
    expect(after.policy_model).not.toBe(before.policy_model);
    expect(after.weather).not.toBe(before.weather);
    expect((await statusDeployment(runDir)).every((s) => s.alive && s.healthy)).toBe(true);
    expect((await chat(endpoints.policy_model!.url, 'wx-2')).status).toBe(200);
  });

  it('restart also replaces a Gym server that is still running', async () => {
    const before = pids();
    await restartDeployment(runDir, { env: ENV, healthTimeoutMs: 60_000 });
    const after = pids();
    expect(running(before.policy_model!)).toBe(false);
    expect(after.policy_model).not.toBe(before.policy_model);
    expect(after.policy_backend).toBe(before.policy_backend);
  });

  it('down: no process of the deployment is left', async () => {
    const before = pids();
    await downDeployment(runDir, { graceMs: 3_000 });
    for (const [name, pid] of Object.entries(before)) {
      expect(running(pid), name).toBe(false);
      expect(groupAlive(pid, name), name).toBe(false);
    }
    expect((await statusDeployment(runDir)).some((s) => s.alive)).toBe(false);
  });
});

describe('launcher failures', () => {
  it('a config error names the key and starts nothing', async () => {
    const bad = join(tmp, 'bad.yaml');
    writeFileSync(bad, 'servers:\n  policy_model: { kind: model, options: { backend: b, temprature: 1 } }\n');
    const dir = join(tmp, 'bad-run');
    const err = await upDeployment({ config: bad, runDir: dir, env: ENV }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).key).toBe('servers.policy_model.options.temprature');
    expect(existsSync(dir)).toBe(false);
  });

  it('a server that does not come up fails with its log tail, and what started is stopped', async () => {
    const bad = join(tmp, 'dangling.yaml');
    writeFileSync(bad, 'servers:\n  policy_backend: { kind: inference }\n  policy_model: { kind: model, options: { backend: nope } }\n');
    const dir = join(tmp, 'dangling-run');
    const err = await upDeployment({ config: bad, runDir: dir, env: ENV, healthTimeoutMs: 30_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LaunchError);
    expect((err as LaunchError).server).toBe('policy_model');
    expect((err as LaunchError).logTail).toContain("servers.policy_model.options.backend: no server named 'nope'");
    for (const [name, s] of Object.entries(readRunState(dir).servers)) {
      expect(s.pid, name).not.toBeNull();
      expect(running(s.pid!), name).toBe(false);
    }
  });
});
