// The coordination client against several real participant processes over HTTP: a full
// checkpoint, SIGKILL of every process, restore into fresh processes, and an all-or-nothing
// restore that fails on one participant.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  commit,
  committedEnvironmentKeys,
  continuedScope,
  discover,
  forget,
  prepare,
  preparedRestarts,
  resume,
  restore,
  retire,
  type Participants,
} from '../../activities/coordination.js';
import { createControlPool } from '../../activities/control-client.js';
import type { Kind } from '../../protocol/ids.js';
import { startMemoryProcess, type MemoryProcess } from '../helpers/memory-processes.js';

const TOKEN = 'coordination-e2e-token';
const TOPOLOGY: Array<[string, Kind]> = [
  ['env1', 'environment'],
  ['policy', 'model'],
  ['agent1', 'agent'],
  ['res1', 'resources'],
  ['res2', 'resources'],
];

let running: MemoryProcess[] = [];
const dirs: string[] = [];

afterEach(async () => {
  await Promise.all(running.map((p) => p.proc.kill()));
  running = [];
});
afterAll(async () => {
  await pool.close();
  await Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true })));
});

async function startAll(): Promise<MemoryProcess[]> {
  const procs = await Promise.all(TOPOLOGY.map(([name, kind]) => startMemoryProcess(name, kind, TOKEN)));
  running.push(...procs);
  return procs;
}

async function post(p: MemoryProcess, path: string, body: unknown): Promise<void> {
  const r = await fetch(`${p.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  expect(r.status).toBe(200);
}

async function stats(p: MemoryProcess): Promise<{ phase: string; admissionOpen: boolean; retired: string[]; installs: number }> {
  return (await fetch(`${p.url}/_test/stats`)).json() as never;
}

const pool = createControlPool();

async function participantsOf(procs: MemoryProcess[]): Promise<Participants> {
  const found = await discover({ servers: procs.map((p) => ({ name: p.name, url: p.url })), token: TOKEN, pool, probeTimeoutMs: 5_000 });
  expect(found.members.map((m) => m.name)).toEqual(['env1', 'policy', 'agent1', 'res1', 'res2']);
  return { token: TOKEN, pool, members: found.members };
}

const deadline = (s = 10): number => Date.now() / 1000 + s;
const byName = (procs: MemoryProcess[], name: string): MemoryProcess => procs.find((p) => p.name === name)!;

/** Two episodes on every server; r2 cannot be captured by the agent (a restart). */
async function seedEpisodes(procs: MemoryProcess[]): Promise<void> {
  for (const p of procs) {
    await post(p, '/_test/episodes', { key: 'r1', atBoundary: true, payload: { server: p.name, turn: 3, big: '2^70' } });
    await post(p, '/_test/episodes', { key: 'r2', atBoundary: true, restart: p.name === 'agent1', payload: { server: p.name } });
  }
}

async function checkpointOnce(procs: MemoryProcess[], dir: string): Promise<Participants> {
  const dep = await participantsOf(procs);
  const prep = await prepare(dep, { checkpointId: 'ckpt-1', deadlineTs: deadline() });
  expect(prep.prepared).toBe(true);
  expect(preparedRestarts(prep)).toEqual([{ rollout_id: 'r2', attempt: 0 }]);
  const scope = continuedScope(prep, [
    { rollout_id: 'r1', attempt: 0 },
    { rollout_id: 'r2', attempt: 0 },
  ]);
  expect(scope).toEqual([{ rollout_id: 'r1', attempt: 0 }]);
  const replies = await commit(dep, { checkpointId: 'ckpt-1', deadlineTs: deadline(), checkpointDir: dir, scope });
  expect(committedEnvironmentKeys(dep, replies)).toEqual(['r1']);
  for (const r of Object.values(replies)) expect(r.episode_ids).toEqual(['r1']);
  await resume(dep, { checkpointId: 'ckpt-1', deadlineTs: deadline() });
  for (const p of procs) expect(await stats(p)).toMatchObject({ phase: 'idle', admissionOpen: true });
  return dep;
}

describe('coordination over real processes', () => {
  it('prepare → commit → resume, then SIGKILL everything and restore into fresh processes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'coord-e2e-'));
    dirs.push(dir);
    const first = await startAll();
    await seedEpisodes(first);
    await checkpointOnce(first, dir);

    // crash: every process group gets SIGKILL
    await Promise.all(first.map((p) => p.proc.kill()));
    running = [];
    const fresh = await startAll();
    const dep = await participantsOf(fresh);
    const restored = await restore(dep, {
      checkpointId: 'restore-1',
      deadlineTs: deadline(),
      checkpointDir: dir,
      scope: [{ rollout_id: 'r1', attempt: 0 }],
    });
    for (const r of Object.values(restored)) expect(r).toEqual({ phase: 'restored', source_checkpoint_id: 'ckpt-1', restored: ['r1-a1'] });
    await resume(dep, { checkpointId: 'restore-1', deadlineTs: deadline() });
    for (const p of fresh) {
      expect(await stats(p)).toMatchObject({ phase: 'idle', admissionOpen: true });
      const eps = (await (await fetch(`${p.url}/_test/episodes`)).json()) as Array<{ key: string; payload: { server: string; turn: number } }>;
      expect(eps.map((e) => e.key)).toEqual(['r1-a1']);
      expect(eps[0]!.payload).toEqual({ server: p.name, turn: 3, big: '2^70' });
    }
    // the crashed attempt is fenced everywhere until forget
    const late = await fetch(`${byName(fresh, 'res1').url}/ng-rollout/r1/step`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{}',
    });
    expect(late.status).toBe(409);
    expect(((await late.json()) as { error: { code: string } }).error.code).toBe('stale_attempt');
    await forget(dep, { deadlineTs: deadline(), rolloutIds: ['r1', 'r1'] });
    for (const p of fresh) expect((await stats(p)).retired).toEqual([]);
  });

  it('a restore that fails on one participant retires the replacements and leaves everyone resumed', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'coord-e2e-'));
    dirs.push(dir);
    const first = await startAll();
    await seedEpisodes(first);
    await checkpointOnce(first, dir);
    await Promise.all(first.map((p) => p.proc.kill()));
    running = [];

    const fresh = await startAll();
    await post(byName(fresh, 'agent1'), '/_test/faults', { installThrows: true });
    const dep = await participantsOf(fresh);
    const err = await restore(dep, {
      checkpointId: 'restore-2',
      deadlineTs: deadline(),
      checkpointDir: dir,
      scope: [{ rollout_id: 'r1', attempt: 0 }],
      log: () => undefined,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as { failures: Record<string, { code?: string }> }).failures.agent1?.code).toBe('checkpoint_error');
    for (const p of fresh) {
      const st = await stats(p);
      expect(st, p.name).toMatchObject({ phase: 'idle', admissionOpen: true });
      // the replacement attempt r1-a1 was retired everywhere (mark raised, state freed)
      expect(st.retired, p.name).toEqual(['r1-a1']);
      const eps = (await (await fetch(`${p.url}/_test/episodes`)).json()) as unknown[];
      expect(eps, p.name).toEqual([]);
    }
    // retire again is idempotent, and the rollout can then be forgotten everywhere
    await retire(dep, { deadlineTs: deadline(), episodes: [{ rollout_id: 'r1', attempt: 1 }] });
    await forget(dep, { deadlineTs: deadline(), rolloutIds: ['r1'] });
  });
});
