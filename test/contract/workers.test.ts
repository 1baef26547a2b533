// The control-plane contract (route-table.ts, the same table the memory participant is held to in
// control-plane.test.ts) against real multi-worker servers: every Gym kind runs `workers: 2`
// behind its one URL (test/e2e/gym/deployments/contract-workers.yaml), so every answer here is the
// front's one answer from its two worker processes, over real HTTP. No episode runs: the servers
// stay restorable, and each test uses checkpoint IDs of its own (a resumed ID stays fenced).
// Routing, a checkpoint mid-episode and a worker's SIGKILL are in test/e2e/gym/workers.test.ts.
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { PLACE_PART_OPERATION } from '../../servers/control/plugin.js';
import { sleep } from '../helpers/wait.js';
import { TOKEN, bringUp, checkpointDir, tearDown, type Gym } from '../e2e/gym/harness.js';
import {
  BAD_AUTHORIZATION,
  CONTROL_OPS,
  PHASE_TABLE,
  expectPhaseAnswer,
  malformedBodies,
  manifestCorruptions,
  phaseTableBody,
  type Phase,
} from './route-table.js';

const SERVERS = [
  { name: 'counter_env', kind: 'environment' },
  { name: 'simple_agent', kind: 'agent' },
  { name: 'counter', kind: 'resources' },
  { name: 'policy_model', kind: 'model' },
] as const;
const AUTH = { authorization: `Bearer ${TOKEN}` };

let gym: Gym | undefined;
const g = (): Gym => gym!;
const pool = new Agent({ connections: 8 });

beforeAll(async () => {
  gym = await bringUp('contract-workers');
});
afterAll(async () => {
  await tearDown(gym);
  await pool.close();
});

const soon = (s = 10): number => Date.now() / 1000 + s;
let serial = 0;
/** A checkpoint ID no earlier test used. */
const fresh = (what: string): string => `${what}-${++serial}`;

interface Reply {
  status: number;
  body: any;
}

/** One control call; a string body is sent as it is (malformed JSON included). */
async function call(url: string, op: string, body?: unknown, headers: Record<string, string> = AUTH, method?: 'GET' | 'POST'): Promise<Reply> {
  const res = await request(`${url}${CONTROL_PREFIX}/${op}`, {
    method: method ?? (op === 'status' ? 'GET' : 'POST'),
    headers: { ...headers, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    dispatcher: pool,
  });
  const text = await res.body.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* plain text */
  }
  return { status: res.statusCode, body: parsed };
}

describe.each(SERVERS)('$name ($kind) with workers: 2', ({ name, kind }) => {
  const c = (op: string, body?: unknown, headers?: Record<string, string>): Promise<Reply> => call(g().url(name), op, body, headers);
  const statusOf = async (): Promise<any> => (await c('status')).body;
  /** A committed empty checkpoint of this server to restore from (its ID resumed). */
  let source: { id: string; dir: string };

  beforeAll(async () => {
    const id = fresh('source');
    const dir = checkpointDir(g(), id);
    expect((await c('prepare', { checkpoint_id: id, deadline_ts: soon() })).body.phase).toBe('prepared');
    expect((await c('commit', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [] })).body.phase).toBe('committed');
    expect((await c('resume', { checkpoint_id: id, deadline_ts: soon() })).body.idempotent).toBe(false);
    source = { id, dir };
  });

  afterEach(async () => {
    // Every test leaves the server as it found it: idle, admission open (a failed one is cleaned
    // up here, so the next test does not fail for it).
    const st = await statusOf();
    if (st.phase !== 'idle') await c('resume', { checkpoint_id: st.checkpoint_id, deadline_ts: soon() });
    expect(st.phase, 'the test left its checkpoint open').toBe('idle');
  });

  it('one status: its kind, one instance identity, both workers expected', async () => {
    const st = await statusOf();
    expect(st).toMatchObject({ kind, instance: name, phase: 'idle', checkpoint_id: null, lease_expires_at: null, expected_workers: 2 });
    expect(st.instance_id).toMatch(/^[0-9a-f-]{36}$/);
    expect((await statusOf()).instance_id).toBe(st.instance_id);
  });

  it("/metrics is the whole server's: a refusal both workers answered the front counts once, as the server answered it once", async () => {
    const refusals = async (): Promise<number> => {
      const res = await request(`${g().url(name)}/metrics`, { dispatcher: pool });
      const text = await res.body.text();
      return Number(/^gym_refusals_total\{code="invalid_phase"\} (\d+)$/m.exec(text)?.[1]);
    };
    const before = await refusals();
    expect(
      (await c('commit', { checkpoint_id: fresh('idle-commit'), deadline_ts: soon(), checkpoint_dir: checkpointDir(g(), 'x'), episode_ids: [] })).status,
    ).toBe(409);
    expect(await refusals()).toBe(before + 1);
  });

  it('refuses every route without or with a wrong token (401 unauthorized)', async () => {
    for (const op of CONTROL_OPS) {
      for (const headers of BAD_AUTHORIZATION(TOKEN)) {
        const r = await c(op, op === 'status' ? undefined : '{not json', headers);
        expect(r.status, `${op} ${JSON.stringify(headers)}`).toBe(401);
        expect(r.body.error.code).toBe('unauthorized');
      }
    }
  });

  it('every malformed body is a 422 with a detail array, and changes nothing', async () => {
    for (const [op, bodies] of Object.entries(malformedBodies(soon()))) {
      for (const body of bodies) {
        const r = await c(op, body);
        expect(r.status, `${op} ${JSON.stringify(body)}`).toBe(422);
        expect(Array.isArray(r.body.detail), JSON.stringify(r.body)).toBe(true);
      }
    }
  });

  it("wrong method is 405 and an unknown operation is 404, the workers' own place-part included", async () => {
    expect((await call(g().url(name), 'prepare', undefined, AUTH, 'GET')).status).toBe(405);
    expect((await call(g().url(name), 'status', undefined, AUTH, 'POST')).status).toBe(405);
    expect((await call(g().url(name), 'explode', undefined, AUTH, 'POST')).status).toBe(404);
    const place = { checkpoint_id: 'x', file: '/tmp/.records.jsonl.0000000000000000', offset: 0 };
    expect((await call(g().url(name), PLACE_PART_OPERATION, place, AUTH, 'POST')).status).toBe(404);
  });

  /** Brings the server to `phase` under checkpoint ID `id`; the commit writes to `dir`. */
  async function inPhase(phase: Exclude<Phase, 'preparing'>, id: string, dir: string): Promise<void> {
    if (phase === 'idle') return;
    if (phase === 'restored') {
      const r = await c('restore', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: source.dir, episode_ids: [] });
      expect(r.body, JSON.stringify(r.body)).toEqual({ phase: 'restored', source_checkpoint_id: source.id, restored: [] });
      return;
    }
    expect((await c('prepare', { checkpoint_id: id, deadline_ts: soon() })).body.phase).toBe('prepared');
    if (phase === 'committed')
      expect((await c('commit', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [] })).body.phase).toBe('committed');
  }

  // `preparing` needs an episode that is not at a boundary: the memory participant's table covers it.
  for (const phase of ['idle', 'prepared', 'committed', 'restored'] as const) {
    it(`every operation in ${phase} answers as §8.2 says`, async () => {
      for (const [op, row] of Object.entries(PHASE_TABLE)) {
        const id = fresh(`${op}-in-${phase}`);
        const dir = checkpointDir(g(), id);
        await inPhase(phase, id, dir);
        const body = phaseTableBody(op, { id, deadlineTs: soon(), commitDir: dir, restoreDir: source.dir, episodeIds: [] });
        const r = await c(op, body);
        try {
          expectPhaseAnswer(r, row[phase]);
        } catch (err) {
          throw new Error(`${op} in ${phase}: ${(err as Error).message}`);
        }
        await c('resume', { checkpoint_id: id, deadline_ts: soon() });
      }
    });
  }

  it('fencing (§8.3): another ID while one is open is checkpoint_conflict; a resumed ID is stale_checkpoint', async () => {
    const id = fresh('fence');
    await inPhase('prepared', id, '');
    for (const op of ['prepare', 'renew', 'commit', 'resume']) {
      const r = await c(op, { checkpoint_id: fresh('other'), deadline_ts: soon(), ...(op === 'commit' ? { checkpoint_dir: '/tmp/none' } : {}) });
      expect(r.status, op).toBe(409);
      expect(r.body.error.code, op).toBe('checkpoint_conflict');
    }
    expect((await c('resume', { checkpoint_id: id, deadline_ts: soon() })).body.idempotent).toBe(false);
    for (const op of ['prepare', 'renew', 'commit']) {
      const r = await c(op, { checkpoint_id: id, deadline_ts: soon(), ...(op === 'commit' ? { checkpoint_dir: '/tmp/none' } : {}) });
      expect(r.body.error?.code, op).toBe('stale_checkpoint');
    }
    expect((await c('resume', { checkpoint_id: id, deadline_ts: soon() })).body).toEqual({ phase: 'idle', idempotent: true });
    // A resume while idle fences its ID against a delayed prepare; 64 resumed IDs are remembered.
    const aborted = fresh('aborted');
    expect((await c('resume', { checkpoint_id: aborted, deadline_ts: soon() })).body).toEqual({ phase: 'idle', idempotent: true });
    expect((await c('prepare', { checkpoint_id: aborted, deadline_ts: soon() })).body.error.code).toBe('stale_checkpoint');
    const old = Array.from({ length: 65 }, () => fresh('old'));
    for (const oldId of old) await c('resume', { checkpoint_id: oldId, deadline_ts: soon() });
    expect((await c('prepare', { checkpoint_id: old[1], deadline_ts: soon() })).body.error.code).toBe('stale_checkpoint');
    expect((await c('prepare', { checkpoint_id: old[0], deadline_ts: soon() })).body.phase).toBe('prepared');
    await c('resume', { checkpoint_id: old[0], deadline_ts: soon() });
  });

  it('a commit replays with the same arguments and refuses others (checkpoint_conflict)', async () => {
    const id = fresh('replay');
    const dir = checkpointDir(g(), id);
    await inPhase('prepared', id, dir);
    const body = { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [] };
    const first = await c('commit', body);
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    expect(first.body).toMatchObject({ phase: 'committed', episode_ids: [] });
    expect((await c('commit', { ...body, deadline_ts: soon(20) })).body).toEqual(first.body);
    expect((await c('commit', { ...body, checkpoint_dir: checkpointDir(g(), fresh('elsewhere')) })).body.error.code).toBe('checkpoint_conflict');
    expect((await c('commit', { ...body, episode_ids: [{ rollout_id: 'r1', attempt: 0 }] })).body.error.code).toBe('checkpoint_conflict');
    // One manifest for the server, written by the front from both workers' parts.
    const manifest = JSON.parse(await readFile(join(dir, 'gym', kind, name, 'manifest.json'), 'utf8'));
    expect(manifest).toMatchObject({ checkpoint_id: id, record_count: 0 });
    await c('resume', { checkpoint_id: id, deadline_ts: soon() });
  });

  it('a restore replays with the same arguments and refuses another scope', async () => {
    const id = fresh('restore');
    await inPhase('restored', id, '');
    const body = { checkpoint_id: id, deadline_ts: soon(20), checkpoint_dir: source.dir, episode_ids: [] };
    expect((await c('restore', body)).body).toEqual({ phase: 'restored', source_checkpoint_id: source.id, restored: [] });
    expect((await c('restore', { ...body, episode_ids: [{ rollout_id: 'r1', attempt: 0 }] })).body.error.code).toBe('checkpoint_conflict');
    expect((await c('retire', { checkpoint_id: fresh('retire'), deadline_ts: soon(), episode_ids: [{ rollout_id: 'r1', attempt: 0 }] })).body.error.code).toBe(
      'checkpoint_conflict',
    );
    expect((await c('resume', { checkpoint_id: id, deadline_ts: soon() })).body.idempotent).toBe(false);
  });

  it('every corrupt checkpoint is invalid_checkpoint_state (422), never a 500, and not fenced', async () => {
    const manifestPath = join(source.dir, 'gym', kind, name, 'manifest.json');
    const good = await readFile(manifestPath, 'utf8');
    const cases = manifestCorruptions(manifestPath, good);
    const id = fresh('corrupt');
    try {
      for (const [what, corrupt] of cases) {
        await writeFile(manifestPath, good);
        await corrupt();
        const r = await c('restore', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: source.dir, episode_ids: [] });
        expect(r.status, `${what}: ${JSON.stringify(r.body)}`).toBe(422);
        expect(r.body.error.code, what).toBe('invalid_checkpoint_state');
        expect((await statusOf()).phase, what).toBe('idle');
      }
    } finally {
      await writeFile(manifestPath, good);
    }
    // Not fenced: the same ID restores once the files are good again.
    expect((await c('restore', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: source.dir, episode_ids: [] })).body.phase).toBe('restored');
    await c('resume', { checkpoint_id: id, deadline_ts: soon() });
  });

  it('a commit into an unwritable directory is invalid_checkpoint_state', async () => {
    const id = fresh('unwritable');
    const file = join(g().tmp, `${id}-a-file`);
    await writeFile(file, 'x');
    await inPhase('prepared', id, '');
    const r = await c('commit', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: file, episode_ids: [] });
    expect(r.status, JSON.stringify(r.body)).toBe(422);
    expect(r.body.error.code).toBe('invalid_checkpoint_state');
    await c('resume', { checkpoint_id: id, deadline_ts: soon() });
  });

  it('a lease (§8.6) expires in every worker: idle again on its own, the ID fenced; the lease never shrinks', async () => {
    const id = fresh('lease');
    await c('prepare', { checkpoint_id: id, deadline_ts: soon(0.1) });
    const renewed = await c('renew', { checkpoint_id: id, deadline_ts: soon(0.2) });
    const shorter = await c('renew', { checkpoint_id: id, deadline_ts: soon(0) });
    expect(shorter.body.lease_expires_at).toBe(renewed.body.lease_expires_at);
    expect((await statusOf()).lease_expires_at).toBe(renewed.body.lease_expires_at);
    await sleep((renewed.body.lease_expires_at - Date.now() / 1000) * 1000 + 500);
    expect(await statusOf()).toMatchObject({ phase: 'idle', checkpoint_id: null, lease_expires_at: null });
    expect((await c('commit', { checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: '/tmp/x', episode_ids: [] })).body.error.code).toBe('stale_checkpoint');
  });

  it('retire and forget count each rollout once across the workers; both are invalid_phase while a checkpoint is open', async () => {
    const before = (await statusOf()).retired_rollouts;
    const rollouts = Array.from({ length: 12 }, (_, i) => `${name}-retired-${i}`);
    const retired = await c('retire', {
      checkpoint_id: 'retire',
      deadline_ts: soon(),
      episode_ids: rollouts.map((rollout_id) => ({ rollout_id, attempt: 1 })),
    });
    expect(retired.body).toEqual({ retired_count: 12 });
    expect((await statusOf()).retired_rollouts).toBe(before + 12);
    const id = fresh('open');
    await inPhase('prepared', id, '');
    expect((await c('retire', { checkpoint_id: id, deadline_ts: soon(), episode_ids: [{ rollout_id: 'x', attempt: 0 }] })).body.error.code).toBe(
      'invalid_phase',
    );
    expect((await c('forget', { checkpoint_id: id, deadline_ts: soon(), rollout_ids: rollouts })).body.error.code).toBe('invalid_phase');
    await c('resume', { checkpoint_id: id, deadline_ts: soon() });
    expect((await c('forget', { checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: rollouts })).body).toEqual({ forgotten_count: 12 });
    expect((await statusOf()).retired_rollouts).toBe(before);
  });
});

describe('a model server without checkpoint_policy, with workers: 2', () => {
  it('is no participant: every control route is 404, as on one process', async () => {
    for (const op of CONTROL_OPS) {
      const r = await call(g().url('plain_model'), op, op === 'status' ? undefined : { checkpoint_id: 'x', deadline_ts: soon() });
      expect(r.status, op).toBe(404);
    }
  });
});
