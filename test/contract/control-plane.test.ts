// Contract tests of the shared control plane through its HTTP routes (Fastify inject), with the
// in-memory test participant behind the hooks.
import { readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { COLLECT_DELAY_MS } from '../../servers/control/collect-after-release.js';
import type { Kind } from '../../protocol/ids.js';
import { buildMemoryServer, type MemoryParticipant } from '../participants/memory-participant.js';
import { sleep } from '../helpers/wait.js';
import { tempDir } from '../helpers/temp-dir.js';
import { BAD_AUTHORIZATION, CONTROL_OPS, PHASES, PHASE_TABLE, expectPhaseAnswer, malformedBodies, manifestCorruptions, phaseTableBody } from './route-table.js';

const TOKEN = 'test-token';
const AUTH = { authorization: `Bearer ${TOKEN}` };
const apps: FastifyInstance[] = [];

afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

/** Servers live as long as the file: so do their directories. */
const checkpointDir = (): string => tempDir('ckpt-contract', 'file');

interface Server {
  app: FastifyInstance;
  p: MemoryParticipant;
  call(op: string, body?: unknown, headers?: Record<string, string>): Promise<{ status: number; body: any }>;
}

async function server(opts: { instance?: string; kind?: Kind; leaseGraceSeconds?: number; leaseRetryMs?: number } = {}): Promise<Server> {
  const { app, participant } = await buildMemoryServer({
    instance: opts.instance ?? 'env1',
    kind: opts.kind ?? 'environment',
    token: TOKEN,
    leaseGraceSeconds: opts.leaseGraceSeconds,
    leaseRetryMs: opts.leaseRetryMs,
  });
  apps.push(app);
  return {
    app,
    p: participant,
    async call(op, body, headers = AUTH) {
      const res = await app.inject({
        method: op === 'status' ? 'GET' : 'POST',
        url: `${CONTROL_PREFIX}/${op}`,
        headers: { ...headers, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
        payload: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
      });
      let parsed: unknown = res.body;
      try {
        parsed = JSON.parse(res.body);
      } catch {
        /* plain text */
      }
      return { status: res.statusCode, body: parsed };
    },
  };
}

const soon = (s = 5): number => Date.now() / 1000 + s;
const past = (): number => Date.now() / 1000 - 1;
const ep = (rollout_id: string, attempt = 0) => ({ rollout_id, attempt });

describe('authentication', () => {
  it('refuses every route without or with a wrong token (401 unauthorized)', async () => {
    const s = await server();
    for (const op of CONTROL_OPS) {
      for (const headers of BAD_AUTHORIZATION(TOKEN)) {
        const r = await s.call(op, op === 'status' ? undefined : '{not json', headers);
        expect(r.status, `${op} ${JSON.stringify(headers)}`).toBe(401);
        expect(r.body.error.code).toBe('unauthorized');
      }
    }
  });

  it('refuses to mount with an empty token', async () => {
    await expect(buildMemoryServer({ instance: 'x', kind: 'agent', token: '' })).rejects.toThrow(/token/);
  });
});

describe('request validation', () => {
  const malformed = malformedBodies(soon());
  for (const [op, bodies] of Object.entries(malformed)) {
    it(`${op}: every malformed body is a 422 with a detail array`, async () => {
      const s = await server();
      for (const body of bodies) {
        const r = await s.call(op, body);
        expect(r.status, `${op} ${JSON.stringify(body)}`).toBe(422);
        expect(Array.isArray(r.body.detail), JSON.stringify(r.body)).toBe(true);
      }
      // Nothing changed: still idle with nothing active.
      expect((await s.call('status')).body.phase).toBe('idle');
    });
  }

  it('accepts a missing attempt (default 0) and a numeric-string deadline', async () => {
    const s = await server();
    const r = await s.call('retire', { checkpoint_id: 'retire', deadline_ts: String(soon()), episode_ids: [{ rollout_id: 'r9' }] });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ retired_count: 1 });
    expect(s.p.plane.isRetired({ rollout_id: 'r9', attempt: 0 })).toBe(true);
  });

  it('wrong method is 405 and an unknown operation is 404', async () => {
    const s = await server();
    expect((await s.app.inject({ method: 'GET', url: `${CONTROL_PREFIX}/prepare`, headers: AUTH })).statusCode).toBe(405);
    expect((await s.app.inject({ method: 'POST', url: `${CONTROL_PREFIX}/status`, headers: AUTH })).statusCode).toBe(405);
    expect((await s.app.inject({ method: 'POST', url: `${CONTROL_PREFIX}/explode`, headers: AUTH })).statusCode).toBe(404);
  });
});

/** Brings a fresh server to a phase under checkpoint ID `C`. */
async function inPhase(phase: string): Promise<{ s: Server; dir: string }> {
  const dir = checkpointDir();
  if (phase === 'restored') {
    const src = await server();
    src.p.upsert('r1', { atBoundary: true, payload: { n: 1 } });
    expect((await src.call('prepare', { checkpoint_id: 'SRC', deadline_ts: soon() })).body.phase).toBe('prepared');
    expect((await src.call('commit', { checkpoint_id: 'SRC', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] })).status).toBe(200);
    const s = await server();
    const r = await s.call('restore', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    return { s, dir };
  }
  const s = await server();
  if (phase === 'idle') return { s, dir };
  if (phase === 'preparing') {
    s.p.upsert('r1', { atBoundary: false });
    const r = await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(0.2) });
    expect(r.body.phase).toBe('preparing');
    expect(r.body.report.blockers).toEqual(['r1']);
    return { s, dir };
  }
  s.p.upsert('r1', { atBoundary: true, payload: { n: 1 } });
  expect((await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon() })).body.phase).toBe('prepared');
  if (phase === 'committed') {
    expect((await s.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] })).status).toBe(200);
  }
  return { s, dir };
}

describe('allowed operations per phase (§8.2), same checkpoint ID', () => {
  for (const [op, row] of Object.entries(PHASE_TABLE)) {
    for (const phase of PHASES) {
      it(`${op} in ${phase} → ${row[phase]}`, async () => {
        const { s, dir } = await inPhase(phase);
        let restoreDir = dir;
        if (op === 'restore' && phase === 'idle') {
          // a real checkpoint to restore from
          const src = await server();
          src.p.upsert('r1', { atBoundary: true, payload: 1 });
          await src.call('prepare', { checkpoint_id: 'SRC', deadline_ts: soon() });
          restoreDir = checkpointDir();
          expect((await src.call('commit', { checkpoint_id: 'SRC', deadline_ts: soon(), checkpoint_dir: restoreDir, episode_ids: [ep('r1')] })).status).toBe(
            200,
          );
        }
        if (phase === 'preparing' && op === 'prepare') s.p.upsert('r1', { atBoundary: false });
        const body = phaseTableBody(op, { id: 'C', deadlineTs: soon(op === 'prepare' ? 0.2 : 5), commitDir: dir, restoreDir, episodeIds: [ep('r1')] });
        expectPhaseAnswer(await s.call(op, body), row[phase]);
      });
    }
  }
});

describe('fencing (§8.3)', () => {
  it('a second ID while one is open is checkpoint_conflict; a resumed ID is stale_checkpoint', async () => {
    const { s } = await inPhase('prepared');
    for (const op of ['prepare', 'renew', 'commit', 'resume']) {
      const r = await s.call(op, { checkpoint_id: 'OTHER', deadline_ts: soon(), ...(op === 'commit' ? { checkpoint_dir: '/tmp/none' } : {}) });
      expect(r.status).toBe(409);
      expect(r.body.error.code, op).toBe('checkpoint_conflict');
    }
    expect((await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).body.idempotent).toBe(false);
    for (const op of ['prepare', 'renew', 'commit']) {
      const r = await s.call(op, { checkpoint_id: 'C', deadline_ts: soon(), ...(op === 'commit' ? { checkpoint_dir: '/tmp/none' } : {}) });
      expect(r.body.error?.code, op).toBe('stale_checkpoint');
    }
    expect((await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).body).toEqual({ phase: 'idle', idempotent: true });
  });

  it('resume of an idle participant fences the ID against a delayed prepare', async () => {
    const s = await server();
    expect((await s.call('resume', { checkpoint_id: 'ABORTED', deadline_ts: soon() })).body).toEqual({ phase: 'idle', idempotent: true });
    const r = await s.call('prepare', { checkpoint_id: 'ABORTED', deadline_ts: soon() });
    expect(r.body.error.code).toBe('stale_checkpoint');
    expect(s.p.gate.isOpen).toBe(true);
  });

  it('remembers only the 64 most recent resumed IDs', async () => {
    const s = await server();
    for (let i = 0; i < 65; i++) await s.call('resume', { checkpoint_id: `old-${i}`, deadline_ts: soon() });
    expect((await s.call('prepare', { checkpoint_id: 'old-1', deadline_ts: soon() })).body.error.code).toBe('stale_checkpoint');
    await s.call('resume', { checkpoint_id: 'old-1', deadline_ts: soon() });
    // old-0 was evicted: a prepare under it is accepted again
    expect((await s.call('prepare', { checkpoint_id: 'old-0', deadline_ts: soon() })).body.phase).toBe('prepared');
  });

  it('retire and forget while open are invalid_phase; in restored another ID is checkpoint_conflict', async () => {
    const { s } = await inPhase('prepared');
    expect((await s.call('forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] })).body.error.code).toBe('invalid_phase');
    const { s: r } = await inPhase('restored');
    expect((await r.call('retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1')] })).body.error.code).toBe('checkpoint_conflict');
    expect((await r.call('forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] })).body.error.code).toBe('checkpoint_conflict');
  });
});

describe('prepare', () => {
  it('waits for readiness, returns blockers at the deadline and keeps admission closed', async () => {
    const s = await server();
    s.p.upsert('b', { atBoundary: false });
    s.p.upsert('a', { atBoundary: true });
    const r = await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(0.3) });
    expect(r.body.phase).toBe('preparing');
    expect(r.body.report).toMatchObject({ ready: false, blockers: ['b'], blocker_count: 1 });
    expect(s.p.gate.isOpen).toBe(false);
    // the blocker parks while a second prepare waits: it wakes and prepares
    const second = s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(5) });
    setTimeout(() => s.p.upsert('b', { atBoundary: true }), 100);
    const t0 = Date.now();
    expect((await second).body.phase).toBe('prepared');
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  it('caps blockers at 100 and counts them all; restarts are uncapped and do not block', async () => {
    const s = await server();
    for (let i = 0; i < 150; i++) s.p.upsert(`b${String(i).padStart(3, '0')}`, { atBoundary: false });
    for (let i = 0; i < 120; i++) s.p.upsert(`r${i}`, { restart: true, atBoundary: false });
    const r = await s.call('prepare', { checkpoint_id: 'C', deadline_ts: past() });
    expect(r.body.report.blockers).toHaveLength(100);
    expect(r.body.report.blockers[0]).toBe('b000');
    expect(r.body.report.blocker_count).toBe(150);
    expect(r.body.report.restarts).toHaveLength(120);
  });

  it('carried restarts from earlier stages do not block and are not exported', async () => {
    const s = await server({ kind: 'agent' });
    s.p.upsert('r1', { atBoundary: false, payload: 1 });
    s.p.upsert('r2', { atBoundary: true, payload: 2 });
    const r = await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(), restarts: ['r1'] });
    expect(r.body.phase).toBe('prepared');
    const c = await s.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: checkpointDir(), episode_ids: null });
    expect(c.body.episode_ids).toEqual(['r2']);
  });

  it('a prepare whose admission close fails returns to idle without fencing its ID', async () => {
    const s = await server();
    s.p.faults.closeAdmissionThrows = true;
    const r = await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon() });
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('checkpoint_error');
    expect(s.p.gate.isOpen).toBe(true);
    s.p.faults.closeAdmissionThrows = false;
    expect((await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon() })).body.phase).toBe('prepared');
  });

  it('a resume interrupts a waiting prepare', async () => {
    const s = await server();
    s.p.upsert('b', { atBoundary: false });
    const waiting = s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(20) });
    await sleep(100);
    expect((await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).body.idempotent).toBe(false);
    const r = await waiting;
    expect(r.body.phase).toBe('idle');
    expect(s.p.gate.isOpen).toBe(true);
  });
});

describe('commit', () => {
  it('replays a completed commit with the same arguments, refuses other arguments', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.upsert('r2', { atBoundary: true, payload: 2 });
    const body = { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r2'), ep('r1')] };
    const first = await s.call('commit', body);
    expect(first.status).toBe(200);
    expect(first.body.episode_ids).toEqual(['r1', 'r2']);
    expect(first.body.exported_by).toBe('env1');
    const again = await s.call('commit', { ...body, episode_ids: [ep('r1'), ep('r2')], deadline_ts: soon(9) });
    expect(again.body).toEqual(first.body);
    expect(s.p.exports).toBe(1);
    expect((await s.call('commit', { ...body, checkpoint_dir: checkpointDir() })).body.error.code).toBe('checkpoint_conflict');
    expect((await s.call('commit', { ...body, episode_ids: [ep('r1')] })).body.error.code).toBe('checkpoint_conflict');
    expect((await s.call('commit', { ...body, episode_ids: null })).body.error.code).toBe('checkpoint_conflict');
  });

  it('refuses a scope naming one of its restarts', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.upsert('rs', { restart: true });
    const r = await s.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1'), ep('rs')] });
    expect(r.body.error.code).toBe('restart_in_scope');
  });

  it('a failed export is final for the checkpoint (export_failed)', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.faults.exportThrows = true;
    const body = { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] };
    expect((await s.call('commit', body)).body.error.code).toBe('export_failed');
    s.p.faults.exportThrows = false;
    expect((await s.call('commit', body)).body.error.code).toBe('export_failed');
    expect(s.p.exports).toBe(1);
    expect((await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).body.idempotent).toBe(false);
  });

  it('readiness that regressed after prepare fails the commit for good', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.upsert('late', { atBoundary: false });
    const body = { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] };
    expect((await s.call('commit', body)).body.error.code).toBe('export_failed');
    s.p.upsert('late', { atBoundary: true });
    expect((await s.call('commit', body)).body.error.code).toBe('export_failed');
  });

  it('a commit retried while its export runs awaits the same export; deadline_exceeded leaves it running', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.faults.exportDelayMs = 600;
    const body = { checkpoint_id: 'C', deadline_ts: soon(0.2), checkpoint_dir: dir, episode_ids: [ep('r1')] };
    const r1 = await s.call('commit', body);
    expect(r1.body.error.code).toBe('deadline_exceeded');
    const r2 = await s.call('commit', { ...body, deadline_ts: soon(5) });
    expect(r2.status).toBe(200);
    expect(s.p.exports).toBe(1);
  });

  it('a commit retried after a failed write stores the same records again (one export)', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.upsert('r2', { atBoundary: true, payload: { big: 'x'.repeat(1000) } });
    await writeFile(join(dir, 'gym'), 'not a directory');
    const body = { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1'), ep('r2')] };
    const failed = await s.call('commit', body);
    expect(failed.body.error.code).toBe('invalid_checkpoint_state');
    await rm(join(dir, 'gym'));
    s.p.upsert('r1', { atBoundary: true, payload: { n: 'changed after export' } });
    const ok = await s.call('commit', body);
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect(s.p.exports).toBe(1);
    const text = await readFile(join(dir, 'gym', 'environment', 'env1', ok.body.manifest.records_file), 'utf8');
    expect(text).toContain('"n":1');
    expect(text).not.toContain('changed after export');
  });

  it('a commit retried during its write awaits the same write; resume mid-write leaves no manifest', async () => {
    const big = 'y'.repeat(2 * 1024 * 1024);
    const setup = async (): Promise<{ s: Server; dir: string }> => {
      const r = await inPhase('prepared');
      for (let i = 0; i < 60; i++) r.s.p.upsert(`w${i}`, { atBoundary: true, payload: { big, i } });
      return r;
    };
    const scope = Array.from({ length: 60 }, (_, i) => ep(`w${i}`));
    const { s, dir } = await setup();
    const body = { checkpoint_id: 'C', deadline_ts: soon(30), checkpoint_dir: dir, episode_ids: scope };
    const [a, b] = await Promise.all([s.call('commit', body), sleep(20).then(() => s.call('commit', body))]);
    expect(a.status).toBe(200);
    expect(b.body).toEqual(a.body);
    expect(s.p.exports).toBe(1);

    const { s: s2, dir: dir2 } = await setup();
    const pending = s2.call('commit', { ...body, checkpoint_dir: dir2 });
    await sleep(30);
    expect((await s2.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).body.idempotent).toBe(false);
    const r = await pending;
    expect(r.status).not.toBe(200);
    await new Promise((res) => setTimeout(res, 300));
    const files = await readdir(join(dir2, 'gym', 'environment', 'env1')).catch(() => [] as string[]);
    expect(files).not.toContain('manifest.json');
    expect(files.filter((f) => f.startsWith('.'))).toEqual([]);
  });

  it('resume during a slow export publishes nothing', async () => {
    const { s, dir } = await inPhase('prepared');
    s.p.faults.exportDelayMs = 400;
    const body = { checkpoint_id: 'C', deadline_ts: soon(0.1), checkpoint_dir: dir, episode_ids: [ep('r1')] };
    expect((await s.call('commit', body)).body.error.code).toBe('deadline_exceeded');
    expect((await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).body.idempotent).toBe(false);
    await sleep(700);
    await expect(readdir(join(dir, 'gym', 'environment', 'env1'))).rejects.toThrow();
  });

  it('deletes unclaimed restored state the scope leaves out', async () => {
    const { s, dir } = await inPhase('restored');
    s.p.upsert('n1', { atBoundary: true, payload: 'new' });
    await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() });
    expect(s.p.episodes.has('r1-a1')).toBe(true);
    await s.call('prepare', { checkpoint_id: 'C2', deadline_ts: soon() });
    const r = await s.call('commit', { checkpoint_id: 'C2', deadline_ts: soon(), checkpoint_dir: join(dir, 'next'), episode_ids: [ep('n1')] });
    expect(r.body.episode_ids).toEqual(['n1']);
    expect(s.p.deletedRestored).toEqual(['r1-a1']);
    expect(s.p.plane.isRetired(ep('r1', 1))).toBe(false); // freed without fencing
  });
});

describe('after the release', () => {
  it("a commit's resume has the process collect its garbage once (with --expose-gc); an abort after prepare does not", async () => {
    const gc = vi.fn();
    vi.stubGlobal('gc', gc);
    try {
      const { s } = await inPhase('committed');
      expect((await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).status).toBe(200);
      await vi.waitFor(() => expect(gc).toHaveBeenCalledTimes(1), { timeout: 2_000 });
      const { s: aborted } = await inPhase('prepared');
      expect((await aborted.call('resume', { checkpoint_id: 'C', deadline_ts: soon() })).status).toBe(200);
      await sleep(COLLECT_DELAY_MS + 100);
      expect(gc).toHaveBeenCalledTimes(1);
    } finally {
      vi.unstubAllGlobals();
    }
  });
});

describe('storage through the routes', () => {
  it('payloads round-trip byte for byte, key order kept, big integers and non-finite numbers', async () => {
    const dir = checkpointDir();
    const payload = { z: 1, a: [1, 'two', { y: null, b: true }], '2': 'int-like key', '1': 'first?', big: 2n ** 70n, neg: -Infinity };
    const src = await server();
    src.p.upsert('r1', { atBoundary: true, payload });
    await src.call('prepare', { checkpoint_id: 'C', deadline_ts: soon() });
    const c = await src.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(c.status, JSON.stringify(c.body)).toBe(200);
    const pdir = join(dir, 'gym', 'environment', 'env1');
    const first = await readFile(join(pdir, c.body.manifest.records_file), 'utf8');

    const dst = await server();
    const r = await dst.call('restore', { checkpoint_id: 'R', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(r.body).toEqual({ phase: 'restored', source_checkpoint_id: 'C', restored: ['r1-a1'] });
    await dst.call('resume', { checkpoint_id: 'R', deadline_ts: soon() });
    // the restored episode is exported again under its replacement attempt (N+1 → stored as r1-a1)
    const dir2 = checkpointDir();
    await dst.call('prepare', { checkpoint_id: 'C2', deadline_ts: soon() });
    const c2 = await dst.call('commit', { checkpoint_id: 'C2', deadline_ts: soon(), checkpoint_dir: dir2, episode_ids: [ep('r1', 1)] });
    expect(c2.body.episode_ids).toEqual(['r1-a1']);
    const second = await readFile(join(dir2, 'gym', 'environment', 'env1', c2.body.manifest.records_file), 'utf8');
    const strip = (line: string): string => line.slice(line.indexOf('"payload"'));
    expect(strip(second)).toBe(strip(first));
    expect(first).toContain('-Infinity');
    expect(first).toContain('1180591620717411303424');
  });

  it('every corrupt checkpoint is invalid_checkpoint_state (422), never a 500', async () => {
    const dir = checkpointDir();
    const src = await server();
    src.p.upsert('r1', { atBoundary: true, payload: 1 });
    await src.call('prepare', { checkpoint_id: 'C', deadline_ts: soon() });
    const c = await src.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    const pdir = join(dir, 'gym', 'environment', 'env1');
    const manifestPath = join(pdir, 'manifest.json');
    const good = await readFile(manifestPath, 'utf8');
    const records = join(pdir, c.body.manifest.records_file);
    const goodRecords = await readFile(records, 'utf8');
    const cases: Array<[string, () => Promise<void>]> = [
      ...manifestCorruptions(manifestPath, good),
      ['digest mismatch', () => writeFile(records, goodRecords.replace('1}', '2}'))],
    ];
    for (const [what, corrupt] of cases) {
      await writeFile(manifestPath, good);
      await writeFile(records, goodRecords);
      await corrupt();
      const dst = await server();
      const r = await dst.call('restore', { checkpoint_id: 'R', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
      expect(r.status, what).toBe(422);
      expect(r.body.error.code, what).toBe('invalid_checkpoint_state');
      expect(dst.p.gate.isOpen, what).toBe(true);
      // not fenced: a retry with the same ID is allowed once the files are good again
      expect((await dst.call('status')).body.phase).toBe('idle');
    }
  });

  it('a commit into an unwritable directory is invalid_checkpoint_state', async () => {
    const { s } = await inPhase('prepared');
    const file = join(checkpointDir(), 'a-file');
    await writeFile(file, 'x');
    const r = await s.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: file, episode_ids: [ep('r1')] });
    expect(r.status).toBe(422);
    expect(r.body.error.code).toBe('invalid_checkpoint_state');
  });
});

describe('restore', () => {
  it('refuses a process with live state, marks the scope, and is not fenced when it fails', async () => {
    const { s: committed, dir } = await inPhase('committed');
    await committed.call('resume', { checkpoint_id: 'C', deadline_ts: soon() });
    const live = await server();
    live.p.upsert('other', { atBoundary: false });
    const r = await live.call('restore', { checkpoint_id: 'R', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] });
    expect(r.body.error.code).toBe('checkpoint_error');
    expect(live.p.plane.isRetired(ep('r1'))).toBe(true);
    expect(live.p.plane.isRetired(ep('r1', 1))).toBe(false);
  });

  it('replays with the same arguments; an install failure reopens admission and the ID can be retried', async () => {
    const { s: src, dir } = await inPhase('committed');
    await src.call('resume', { checkpoint_id: 'C', deadline_ts: soon() });
    const s = await server();
    s.p.faults.installThrows = true;
    const body = { checkpoint_id: 'R', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [ep('r1')] };
    expect((await s.call('restore', body)).body.error.code).toBe('checkpoint_error');
    expect(s.p.gate.isOpen).toBe(true);
    s.p.faults.installThrows = false;
    const ok = await s.call('restore', body);
    expect(ok.body.restored).toEqual(['r1-a1']);
    expect(s.p.gate.isOpen).toBe(false); // closed until resume
    expect((await s.call('restore', { ...body, episode_ids: [ep('r1')], deadline_ts: soon(9) })).body).toEqual(ok.body);
    expect((await s.call('restore', { ...body, episode_ids: [] })).body.error.code).toBe('checkpoint_conflict');
    expect((await s.call('resume', { checkpoint_id: 'R', deadline_ts: soon() })).body.idempotent).toBe(false);
    expect(s.p.gate.isOpen).toBe(true);
  });

  it('an empty scope restores nothing and lists nothing', async () => {
    const { s: src, dir } = await inPhase('committed');
    await src.call('resume', { checkpoint_id: 'C', deadline_ts: soon() });
    const s = await server();
    const r = await s.call('restore', { checkpoint_id: 'R', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [] });
    expect(r.body).toEqual({ phase: 'restored', source_checkpoint_id: 'C', restored: [] });
  });
});

describe('lease (§8.6)', () => {
  it('expiry resumes on its own and fences the ID; the lease never shrinks', async () => {
    const s = await server({ leaseGraceSeconds: 0.3 });
    s.p.upsert('r1', { atBoundary: true });
    await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(0.1) });
    const renewed = await s.call('renew', { checkpoint_id: 'C', deadline_ts: soon(0.2) });
    const shorter = await s.call('renew', { checkpoint_id: 'C', deadline_ts: soon(0) });
    expect(shorter.body.lease_expires_at).toBe(renewed.body.lease_expires_at);
    expect(s.p.gate.isOpen).toBe(false);
    await sleep(900);
    const st = (await s.call('status')).body;
    expect(st).toMatchObject({ phase: 'idle', checkpoint_id: null, lease_expires_at: null });
    expect(s.p.gate.isOpen).toBe(true);
    expect((await s.call('commit', { checkpoint_id: 'C', deadline_ts: soon(), checkpoint_dir: '/tmp/x', episode_ids: [] })).body.error.code).toBe(
      'stale_checkpoint',
    );
  });

  it('a failed automatic reopen is retried', async () => {
    const s = await server({ leaseGraceSeconds: 0.2, leaseRetryMs: 200 });
    await s.call('prepare', { checkpoint_id: 'C', deadline_ts: soon(0) });
    const open = s.p.plane.hooks.openAdmission;
    let failures = 0;
    (s.p.plane.hooks as { openAdmission: () => void }).openAdmission = () => {
      if (failures++ < 2) throw new Error('cannot reopen yet');
      open.call(s.p.plane.hooks);
    };
    await sleep(1200);
    expect(failures).toBeGreaterThanOrEqual(3);
    expect(s.p.gate.isOpen).toBe(true);
    expect((await s.call('status')).body.phase).toBe('idle');
  });
});

describe('retire and forget', () => {
  it('retire marks rise only, survive a failed retire, and refuse the data plane until forget', async () => {
    const s = await server();
    s.p.upsert('r1-a2', { atBoundary: true });
    s.p.faults.retireHangs = true;
    const r = await s.call('retire', { checkpoint_id: 'retire', deadline_ts: soon(0.2), episode_ids: [ep('r1', 2)] });
    expect(r.body.error.code).toBe('deadline_exceeded');
    expect(s.p.plane.isRetired(ep('r1', 2))).toBe(true);
    // a retire that arrives after its deadline still raises the mark
    await s.call('retire', { checkpoint_id: 'retire', deadline_ts: past(), episode_ids: [ep('r7', 1)] });
    expect(s.p.plane.isRetired(ep('r7', 1))).toBe(true);
    expect(s.p.plane.isRetired(ep('r7', 2))).toBe(false);
    // the cut-short work stays tracked and blocking until a retried retire finishes it
    expect((await s.call('status')).body.report.blockers).toEqual(['r1-a2']);
    s.p.faults.retireHangs = false;
    expect((await s.call('retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1', 2)] })).body).toEqual({ retired_count: 1 });
    expect((await s.call('status')).body.report.blockers).toEqual([]);
    // a lower attempt does not lower the mark
    expect((await s.call('retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1', 0)] })).body).toEqual({ retired_count: 1 });
    expect(s.p.plane.isRetired(ep('r1', 2))).toBe(true);
    const step = await s.app.inject({ method: 'POST', url: '/ng-rollout/r1-a1/step', payload: {} });
    expect(step.statusCode).toBe(409);
    expect(JSON.parse(step.body).error.code).toBe('stale_attempt');
    expect((await s.call('status')).body.retired_rollouts).toBe(2);
    expect((await s.call('forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1', 'r7'] })).body).toEqual({ forgotten_count: 2 });
    expect((await s.call('status')).body.retired_rollouts).toBe(0);
    expect((await s.app.inject({ method: 'POST', url: '/ng-rollout/r1-a1/step', payload: {} })).statusCode).toBe(200);
  });

  it('forget is refused with retire_incomplete and changes nothing', async () => {
    const s = await server();
    await s.call('retire', { checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [ep('r1')] });
    s.p.faults.liveAfterForgetCheck = true;
    const r = await s.call('forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r1'] });
    expect(r.body.error.code).toBe('retire_incomplete');
    expect(s.p.plane.isRetired(ep('r1'))).toBe(true);
  });

  it('retire while a checkpoint is open is invalid_phase (resume first)', async () => {
    const { s } = await inPhase('committed');
    const r = await s.call('retire', { checkpoint_id: 'C', deadline_ts: soon(), episode_ids: [ep('r1')] });
    expect(r.body.error.code).toBe('invalid_phase');
    expect(s.p.plane.isRetired(ep('r1'))).toBe(false);
  });
});

describe('data plane', () => {
  it('parks a step while admission is closed and lets it through on resume', async () => {
    const { s } = await inPhase('prepared');
    let done = false;
    const step = s.app.inject({ method: 'POST', url: '/ng-rollout/r5/step', payload: { atBoundary: true } }).then((r) => {
      done = true;
      return r;
    });
    await sleep(150);
    expect(done).toBe(false);
    await s.call('resume', { checkpoint_id: 'C', deadline_ts: soon() });
    expect((await step).statusCode).toBe(200);
  });

  it('refuses a step without the rollout prefix', async () => {
    const s = await server();
    const r = await s.app.inject({ method: 'POST', url: '/step', payload: {} });
    expect(JSON.parse(r.body).error.code).toBe('rollout_id_required');
  });
});
