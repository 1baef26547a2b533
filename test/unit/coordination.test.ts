// Coordination sequence (control-plane.md §11) against fake participants: small Fastify servers
// on 127.0.0.1 that record every control call and reply with scripted answers.
import net from 'node:net';
import type { IncomingHttpHeaders } from 'node:http';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  CoordinationError,
  commit,
  committedEnvironmentKeys,
  continuedScope,
  discover,
  failureClass,
  forget,
  isTransient,
  NO_MODEL_MESSAGE,
  prepare,
  preparedBlockers,
  preparedRestarts,
  refusalCode,
  renew,
  restore,
  resume,
  retire,
  type Participants,
  type Member,
  type PrepareResult,
} from '../../activities/coordination.js';
import { createControlPool } from '../../activities/control-client.js';
import type { Kind } from '../../protocol/ids.js';

const TOKEN = 'test-token';
const PREFIX = '/ng-control/v1/checkpoint/';

interface Call {
  server: string;
  op: string;
  method: string;
  headers: IncomingHttpHeaders;
  raw: Buffer;
  body: any;
  /** Global sequence number when the call arrived and when its reply was sent. */
  start: number;
  end: number;
}

interface Scripted {
  status?: number;
  body?: unknown;
  /** Sent as text/plain instead of JSON. */
  text?: string;
  delayMs?: number;
}
type Script = (op: string, body: any) => Scripted | undefined;

let seq = 0;
let calls: Call[] = [];
const apps: FastifyInstance[] = [];
const sockets = new Set<net.Socket>();
const rawServers: net.Server[] = [];

const okReport = { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] };
const manifest = (name: string, kind: string) => ({
  schema_version: 1,
  kind,
  instance: name,
  checkpoint_id: 'ckpt-1',
  records_file: `records-${'a'.repeat(64)}.jsonl`,
  records_sha256: 'a'.repeat(64),
  record_count: 0,
});

function defaultReply(name: string, kind: string, op: string, body: any): unknown {
  switch (op) {
    case 'status':
      return { kind, instance: name, phase: 'idle', checkpoint_id: null, lease_expires_at: null, retired_rollouts: 0, report: okReport };
    case 'prepare':
      return { phase: 'prepared', report: okReport };
    case 'commit':
      return { phase: 'committed', manifest: manifest(name, kind), episode_ids: [] };
    case 'renew':
      return { lease_expires_at: body.deadline_ts + 600 };
    case 'restore':
      return { phase: 'restored', source_checkpoint_id: 'ckpt-1', restored: [] };
    case 'resume':
      return { phase: 'idle', idempotent: false };
    case 'retire':
      return { retired_count: body.episode_ids.length };
    case 'forget':
      return { forgotten_count: body.rollout_ids.length };
    default:
      return { error: { code: 'not_found', detail: op } };
  }
}

async function fake(name: string, kind: string, script?: Script): Promise<Member> {
  const app = Fastify({ forceCloseConnections: true });
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  app.route({
    method: ['GET', 'POST'],
    url: `${PREFIX}:op`,
    handler: async (req, reply) => {
      const op = (req.params as { op: string }).op;
      const raw = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
      const body = raw.length ? JSON.parse(raw.toString('utf8')) : undefined;
      const call: Call = { server: name, op, method: req.method, headers: req.headers, raw, body, start: ++seq, end: 0 };
      calls.push(call);
      const s = script?.(op, body) ?? {};
      if (s.delayMs) await new Promise((r) => setTimeout(r, s.delayMs));
      call.end = ++seq;
      reply.code(s.status ?? 200);
      if (s.text !== undefined) return reply.type('text/plain').send(s.text);
      return reply.type('application/json').send(JSON.stringify(s.body ?? defaultReply(name, kind, op, body)));
    },
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  apps.push(app);
  const addr = app.server.address() as net.AddressInfo;
  return { name, url: `http://127.0.0.1:${addr.port}`, kind: kind as Kind };
}

/** Accepts connections and never writes a byte. */
async function silentServer(): Promise<string> {
  const srv = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => {});
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  rawServers.push(srv);
  return `http://127.0.0.1:${(srv.address() as net.AddressInfo).port}`;
}

/** Accepts connections and closes them at once; counts them. */
async function slammingServer(): Promise<{ url: string; connections: () => number }> {
  let n = 0;
  const srv = net.createServer((s) => {
    n++;
    s.destroy();
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  rawServers.push(srv);
  return { url: `http://127.0.0.1:${(srv.address() as net.AddressInfo).port}`, connections: () => n };
}

async function refusedUrl(): Promise<string> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return `http://127.0.0.1:${port}`;
}

const deadline = (s = 30): number => Date.now() / 1000 + s;
const callsOf = (op: string): Call[] => calls.filter((c) => c.op === op);
const serversOf = (op: string): string[] => callsOf(op).map((c) => c.server);

const pool = createControlPool();

async function participants(specs: [string, Kind, Script?][]): Promise<Participants> {
  const members = await Promise.all(specs.map(([n, k, s]) => fake(n, k, s)));
  return { token: TOKEN, pool, members };
}

afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
  for (const s of sockets) s.destroy();
  sockets.clear();
  await Promise.all(rawServers.splice(0).map((s) => new Promise((r) => s.close(r))));
  calls = [];
});
afterAll(async () => {
  await pool.close();
});

/** All calls of `later` arrived after every call of `earlier` was answered. */
function expectAfter(earlier: Call[], later: Call[]): void {
  const lastEnd = Math.max(...earlier.map((c) => c.end));
  const firstStart = Math.min(...later.map((c) => c.start));
  expect(firstStart).toBeGreaterThan(lastEnd);
}

describe('prepare', () => {
  it('runs the stages environment → model → agent → resources, each stage concurrently', async () => {
    const slow: Script = (op) => (op === 'prepare' ? { delayMs: 150 } : undefined);
    const dep = await participants([
      ['env_a', 'environment', slow],
      ['env_b', 'environment', slow],
      ['policy', 'model', slow],
      ['agent', 'agent', slow],
      ['res_a', 'resources'],
      ['res_b', 'resources'],
    ]);
    const result = await prepare(dep, { checkpointId: 'ckpt-1', deadlineTs: deadline() });
    expect(result.prepared).toBe(true);
    expect(Object.keys(result.replies).sort()).toEqual(['agent', 'env_a', 'env_b', 'policy', 'res_a', 'res_b']);
    const by = (names: string[]) => callsOf('prepare').filter((c) => names.includes(c.server));
    // Both environment calls were in flight together.
    const [a, b] = by(['env_a', 'env_b']);
    expect(Math.max(a!.start, b!.start)).toBeLessThan(Math.min(a!.end, b!.end));
    expectAfter(by(['env_a', 'env_b']), by(['policy']));
    expectAfter(by(['policy']), by(['agent']));
    expectAfter(by(['agent']), by(['res_a', 'res_b']));
    for (const c of callsOf('prepare')) {
      expect(c.method).toBe('POST');
      expect(c.headers['content-type']).toBe('application/json');
      expect(c.headers.authorization).toBe(`Bearer ${TOKEN}`);
      expect(c.body).toEqual({ checkpoint_id: 'ckpt-1', deadline_ts: expect.any(Number) });
    }
  });

  it('forwards the sorted union of earlier restarts, only when non-empty', async () => {
    const restarts =
      (keys: string[]): Script =>
      (op) =>
        op === 'prepare' ? { body: { phase: 'prepared', report: { ...okReport, restarts: keys } } } : undefined;
    const dep = await participants([
      ['env', 'environment', restarts(['r2', 'r1-a1'])],
      ['policy', 'model'],
      ['agent', 'agent', restarts(['r0', 'r2'])],
      ['res', 'resources'],
    ]);
    const result = await prepare(dep, { checkpointId: 'ckpt-2', deadlineTs: deadline() });
    const body = (s: string) => callsOf('prepare').find((c) => c.server === s)!.body;
    expect(body('env')).not.toHaveProperty('restarts');
    expect(body('policy').restarts).toEqual(['r1-a1', 'r2']);
    expect(body('agent').restarts).toEqual(['r1-a1', 'r2']);
    expect(body('res').restarts).toEqual(['r0', 'r1-a1', 'r2']);
    expect(preparedRestarts(result)).toEqual([
      { rollout_id: 'r0', attempt: 0 },
      { rollout_id: 'r1', attempt: 1 },
      { rollout_id: 'r2', attempt: 0 },
    ]);
  });

  it('sends no restarts field at all when no stage reports one', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model'],
      ['agent', 'agent'],
    ]);
    await prepare(dep, { checkpointId: 'ckpt-3', deadlineTs: deadline() });
    for (const c of callsOf('prepare')) expect(c.body).not.toHaveProperty('restarts');
  });

  it('stops at the first unprepared stage; later stages are never contacted', async () => {
    const dep = await participants([
      ['env', 'environment'],
      [
        'policy',
        'model',
        (op) =>
          op === 'prepare'
            ? {
                body: { phase: 'preparing', report: { ready: false, blockers: ['r1', 'model-worker-lost'], blocker_count: 250, counts: {}, restarts: ['r9'] } },
              }
            : undefined,
      ],
      ['agent', 'agent'],
      ['res', 'resources'],
    ]);
    const result = await prepare(dep, { checkpointId: 'ckpt-4', deadlineTs: deadline() });
    expect(result.prepared).toBe(false);
    expect(result.stoppedAt).toBe('model');
    expect(serversOf('prepare').sort()).toEqual(['env', 'policy']);
    expect(preparedBlockers(result)).toEqual({ policy: ['r1', 'model-worker-lost'] });
    expect(result.replies.policy!.report.blocker_count).toBe(250);
    expect(preparedRestarts(result)).toEqual([{ rollout_id: 'r9', attempt: 0 }]);
    // Plain data: survives a JSON round trip (a Temporal activity boundary) unchanged.
    expect(JSON.parse(JSON.stringify(result))).toEqual(result);
  });

  it('continuedScope drops restarts of the same rollout and attempt only', () => {
    const result: PrepareResult = {
      checkpointId: 'c',
      prepared: true,
      replies: {
        env: { phase: 'prepared', report: { ...okReport, restarts: ['r1-a1', 'not/a/key'] } },
        res: { phase: 'prepared', report: { ...okReport, restarts: ['r3', 'r1-a1'] } },
      },
    };
    const episodes = [
      { rollout_id: 'r1', attempt: 0 },
      { rollout_id: 'r2', attempt: 0 },
      { rollout_id: 'r1', attempt: 1 },
      { rollout_id: 'r3', attempt: 1 },
      { rollout_id: 'r3', attempt: 0 },
    ];
    expect(preparedRestarts(result)).toEqual([
      { rollout_id: 'r1', attempt: 1 },
      { rollout_id: 'r3', attempt: 0 },
    ]);
    expect(continuedScope(result, episodes)).toEqual([
      { rollout_id: 'r1', attempt: 0 },
      { rollout_id: 'r2', attempt: 0 },
      { rollout_id: 'r3', attempt: 1 },
    ]);
  });

  it('a non-200 in a stage is a CoordinationError after the whole stage answered', async () => {
    const dep = await participants([
      ['env_a', 'environment', (op) => (op === 'prepare' ? { status: 409, body: { error: { code: 'stale_checkpoint', detail: 'resumed' } } } : undefined)],
      ['env_b', 'environment', (op) => (op === 'prepare' ? { delayMs: 80 } : undefined)],
      ['policy', 'model'],
    ]);
    const err = await prepare(dep, { checkpointId: 'ckpt-5', deadlineTs: deadline() }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(err.failures).toEqual({
      env_a: { status: 409, code: 'stale_checkpoint', detail: 'resumed', description: 'HTTP 409 stale_checkpoint resumed' },
    });
    expect(callsOf('prepare').find((c) => c.server === 'env_b')!.end).toBeGreaterThan(0);
    expect(serversOf('prepare')).not.toContain('policy');
    expect(refusalCode(err)).toBe('stale_checkpoint');
    expect(isTransient(err)).toBe(false);
  });
});

describe('commit, renew', () => {
  it('sends identical bytes to every participant, stop only when true, attempt always', async () => {
    const dep = await participants([
      [
        'env',
        'environment',
        (op) => (op === 'commit' ? { body: { phase: 'committed', manifest: manifest('env', 'environment'), episode_ids: ['r2', 'r1-a1'] } } : undefined),
      ],
      [
        'env2',
        'environment',
        (op) => (op === 'commit' ? { body: { phase: 'committed', manifest: manifest('env2', 'environment'), episode_ids: ['r3'] } } : undefined),
      ],
      [
        'policy',
        'model',
        (op) =>
          op === 'commit' ? { body: { phase: 'committed', manifest: manifest('policy', 'model'), episode_ids: ['zz'], staging_keys: ['s/1'] } } : undefined,
      ],
      ['agent', 'agent'],
      ['res', 'resources'],
    ]);
    const scope = [
      { rollout_id: 'r1', attempt: 1 },
      { rollout_id: 'r2', attempt: 0 },
    ];
    const replies = await commit(dep, { checkpointId: 'ckpt-6', deadlineTs: deadline(), checkpointDir: '/tmp/ck', scope });
    const commits = callsOf('commit');
    expect(commits.map((c) => c.server).sort()).toEqual(['agent', 'env', 'env2', 'policy', 'res']);
    for (const c of commits) expect(c.raw.equals(commits[0]!.raw)).toBe(true);
    expect(commits[0]!.body).toEqual({
      checkpoint_id: 'ckpt-6',
      deadline_ts: expect.any(Number),
      checkpoint_dir: '/tmp/ck',
      episode_ids: [
        { rollout_id: 'r1', attempt: 1 },
        { rollout_id: 'r2', attempt: 0 },
      ],
    });
    expect(replies.policy!.staging_keys).toEqual(['s/1']);
    expect(committedEnvironmentKeys(dep, replies)).toEqual(['r1-a1', 'r2', 'r3']);

    calls = [];
    await commit(dep, {
      checkpointId: 'ckpt-7',
      deadlineTs: deadline(),
      checkpointDir: '/tmp/ck',
      scope: [{ rollout_id: 'r5' } as never],
      stop: true,
    });
    for (const c of callsOf('commit')) {
      expect(c.body.stop).toBe(true);
      expect(c.body.episode_ids).toEqual([{ rollout_id: 'r5', attempt: 0 }]);
    }
    calls = [];
    await commit(dep, { checkpointId: 'ckpt-8', deadlineTs: deadline(), checkpointDir: '/tmp/ck', scope: [], stop: false });
    for (const c of callsOf('commit')) {
      expect(c.body).not.toHaveProperty('stop');
      expect(c.body.episode_ids).toEqual([]);
    }
  });

  it('a 200 whose body fails the reply schema is that server’s failure', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model', (op) => (op === 'commit' ? { body: { phase: 'committed' } } : undefined)],
    ]);
    const err = await commit(dep, { checkpointId: 'c', deadlineTs: deadline(), checkpointDir: '/d', scope: [] }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(Object.keys(err.failures)).toEqual(['policy']);
    expect(err.failures.policy.invalidReply).toBe(true);
    expect(failureClass(err.failures.policy)).toBe('protocol_violation');
  });

  it('renew fans out to everyone', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model'],
      ['res', 'resources'],
    ]);
    const d = deadline();
    const replies = await renew(dep, { checkpointId: 'ckpt-9', deadlineTs: d });
    expect(Object.keys(replies).sort()).toEqual(['env', 'policy', 'res']);
    expect(replies.env!.lease_expires_at).toBeCloseTo(d + 600);
    const renews = callsOf('renew');
    for (const c of renews) expect(c.raw.equals(renews[0]!.raw)).toBe(true);
  });
});

describe('resume', () => {
  it('runs resources → agent → model → environment', async () => {
    const slow: Script = (op) => (op === 'resume' ? { delayMs: 30 } : undefined);
    const dep = await participants([
      ['env', 'environment', slow],
      ['policy', 'model', slow],
      ['agent', 'agent', slow],
      ['res_a', 'resources', slow],
      ['res_b', 'resources', slow],
    ]);
    const replies = await resume(dep, { checkpointId: 'ckpt-1', deadlineTs: deadline() });
    expect(Object.keys(replies).sort()).toEqual(['agent', 'env', 'policy', 'res_a', 'res_b']);
    const by = (n: string[]) => callsOf('resume').filter((c) => n.includes(c.server));
    expectAfter(by(['res_a', 'res_b']), by(['agent']));
    expectAfter(by(['agent']), by(['policy']));
    expectAfter(by(['policy']), by(['env']));
  });

  it('contacts everyone and aggregates the failures; tolerates non-envelope error bodies', async () => {
    const dep = await participants([
      ['env', 'environment', (op) => (op === 'resume' ? { status: 500, text: 'Internal Server Error' } : undefined)],
      ['policy', 'model', (op) => (op === 'resume' ? { status: 422, body: { detail: [{ type: 'missing', loc: ['body', 'deadline_ts'] }] } } : undefined)],
      ['agent', 'agent'],
      [
        'res',
        'resources',
        (op) => (op === 'resume' ? { status: 409, body: { error: { code: 'deadline_exceeded', detail: 'cleanup still running' } } } : undefined),
      ],
    ]);
    const err = await resume(dep, { checkpointId: 'ckpt-1', deadlineTs: deadline() }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(serversOf('resume')).toEqual(['res', 'agent', 'policy', 'env']);
    expect(Object.keys(err.failures).sort()).toEqual(['env', 'policy', 'res']);
    expect(err.failures.env).toMatchObject({ status: 500, detail: 'Internal Server Error', description: 'HTTP 500 Internal Server Error' });
    expect(err.failures.env.code).toBeUndefined();
    expect(err.failures.policy.status).toBe(422);
    expect(err.failures.policy.code).toBeUndefined();
    expect(err.failures.policy.description).toMatch(/^HTTP 422 \{"detail"/);
    expect(err.failures.res.description).toBe('HTTP 409 deadline_exceeded cleanup still running');
    expect(failureClass(err.failures.env)).toBe('transient');
    expect(failureClass(err.failures.policy)).toBe('protocol_violation');
    expect(failureClass(err.failures.res)).toBe('retryable_refusal');
    expect(refusalCode(err)).toBeUndefined();
    expect(err.message).toContain('env: HTTP 500 Internal Server Error');
    // Serializable.
    expect(JSON.parse(JSON.stringify(err)).failures).toEqual(err.failures);
  });

  it('a transport failure is transient', async () => {
    const dep: Participants = {
      token: TOKEN,
      pool,
      members: [{ name: 'gone', url: await refusedUrl(), kind: 'environment' }],
    };
    const err = await resume(dep, { checkpointId: 'c', deadlineTs: deadline() }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(err.failures.gone.transport).toBe(true);
    expect(isTransient(err)).toBe(true);
  });
});

describe('restore', () => {
  it('on success returns the replies; one body for all', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model'],
    ]);
    const replies = await restore(dep, {
      checkpointId: 'restore-1',
      deadlineTs: deadline(),
      checkpointDir: '/ck',
      scope: [{ rollout_id: 'r1', attempt: 0 }],
    });
    expect(replies.env!.phase).toBe('restored');
    expect(serversOf('retire')).toEqual([]);
    expect(serversOf('resume')).toEqual([]);
    const r = callsOf('restore');
    expect(r[0]!.raw.equals(r[1]!.raw)).toBe(true);
    expect(r[0]!.body.episode_ids).toEqual([{ rollout_id: 'r1', attempt: 0 }]);
  });

  it('a failure retires N+1 in retire order with the restore ID, resumes everyone, raises the original error', async () => {
    const logged: string[] = [];
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model', (op) => (op === 'restore' ? { status: 409, body: { error: { code: 'checkpoint_error', detail: 'served calls' } } } : undefined)],
      ['agent', 'agent', (op) => (op === 'retire' ? { status: 500, text: 'boom' } : undefined)],
      ['res', 'resources'],
    ]);
    const d = deadline(1);
    const err = await restore(dep, {
      checkpointId: 'restore-2',
      deadlineTs: d,
      checkpointDir: '/ck',
      scope: [
        { rollout_id: 'r1', attempt: 0 },
        { rollout_id: 'r2', attempt: 3 },
      ],
      log: (m) => logged.push(m),
    }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(err.operation).toBe('restore');
    expect(Object.keys(err.failures)).toEqual(['policy']);
    expect(err.failures.policy.code).toBe('checkpoint_error');
    expect(refusalCode(err)).toBe('checkpoint_error');

    // Retire: environment first, then agent (which fails, aborting the retire sequence).
    const retires = callsOf('retire');
    expect(retires.map((c) => c.server)).toEqual(['env', 'agent']);
    for (const c of retires) {
      expect(c.body.checkpoint_id).toBe('restore-2');
      expect(c.body.episode_ids).toEqual([
        { rollout_id: 'r1', attempt: 1 },
        { rollout_id: 'r2', attempt: 4 },
      ]);
      // Cleanup deadline = max(deadline, now + 30 s).
      expect(c.body.deadline_ts).toBeGreaterThan(d + 25);
    }
    expectAfter(
      retires.filter((c) => c.server === 'env'),
      retires.filter((c) => c.server === 'agent'),
    );
    // Everyone resumed, reverse order, with the restore's ID.
    expect(serversOf('resume')).toEqual(['res', 'agent', 'policy', 'env']);
    for (const c of callsOf('resume')) expect(c.body.checkpoint_id).toBe('restore-2');
    expectAfter(retires, callsOf('resume'));
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatch(/retire/);
  });

  it('retires in all three groups when every retire succeeds', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model'],
      ['agent', 'agent'],
      [
        'res',
        'resources',
        (op) => (op === 'restore' ? { status: 503, body: { error: { code: 'checkpoint_coordinator_unavailable', detail: 'x' } } } : undefined),
      ],
    ]);
    const err = await restore(dep, {
      checkpointId: 'restore-3',
      deadlineTs: deadline(),
      checkpointDir: '/ck',
      scope: [{ rollout_id: 'r1', attempt: 0 }],
      log: () => {},
    }).catch((e) => e);
    expect(isTransient(err)).toBe(true);
    const retires = callsOf('retire');
    expect(retires.slice(0, 2).map((c) => c.server)).toEqual(['env', 'agent']);
    expect(
      retires
        .slice(2)
        .map((c) => c.server)
        .sort(),
    ).toEqual(['policy', 'res']);
    expect(serversOf('resume')).toEqual(['res', 'agent', 'policy', 'env']);
  });
});

describe('retire and forget', () => {
  it('retires group by group: environment, agent, then model + resources together', async () => {
    const slow: Script = (op) => (op === 'retire' ? { delayMs: 150 } : undefined);
    const dep = await participants([
      ['env', 'environment', slow],
      ['policy', 'model', slow],
      ['agent', 'agent', slow],
      ['res', 'resources', (op) => (op === 'retire' ? { delayMs: 150, body: { retired: ['r1-a2'] } } : undefined)],
    ]);
    const replies = await retire(dep, { deadlineTs: deadline(), episodes: [{ rollout_id: 'r1', attempt: 2 }] });
    const retires = callsOf('retire');
    const by = (n: string[]) => retires.filter((c) => n.includes(c.server));
    expectAfter(by(['env']), by(['agent']));
    expectAfter(by(['agent']), by(['policy', 'res']));
    const [p, r] = by(['policy', 'res']);
    expect(Math.max(p!.start, r!.start)).toBeLessThan(Math.min(p!.end, r!.end));
    for (const c of retires) {
      expect(c.body).toEqual({ checkpoint_id: 'retire', deadline_ts: expect.any(Number), episode_ids: [{ rollout_id: 'r1', attempt: 2 }] });
      expect(c.raw.equals(retires[0]!.raw)).toBe(true);
    }
    // Both reply shapes.
    expect(replies.env).toEqual({ retired_count: 1 });
    expect(replies.res).toEqual({ retired_count: 1, retired: ['r1-a2'] });
  });

  it('a failing group aborts the sequence', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model'],
      ['agent', 'agent', (op) => (op === 'retire' ? { status: 409, body: { error: { code: 'invalid_phase', detail: 'open checkpoint' } } } : undefined)],
      ['res', 'resources'],
    ]);
    const err = await retire(dep, { deadlineTs: deadline(), episodes: [{ rollout_id: 'r1', attempt: 0 }] }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(err.operation).toBe('retire');
    expect(err.failures.agent.code).toBe('invalid_phase');
    expect(serversOf('retire')).toEqual(['env', 'agent']);
  });

  it('skips the call when there is nothing to retire or forget', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model'],
    ]);
    expect(await retire(dep, { deadlineTs: deadline(), episodes: [] })).toEqual({});
    expect(await forget(dep, { deadlineTs: deadline(), rolloutIds: [] })).toEqual({});
    expect(calls).toEqual([]);
  });

  it('forget de-duplicates and sorts rollout IDs, same group order, both reply shapes', async () => {
    const dep = await participants([
      ['env', 'environment'],
      ['policy', 'model', (op) => (op === 'forget' ? { body: { forgotten: ['a', 'b'] } } : undefined)],
      ['agent', 'agent'],
      ['res', 'resources'],
    ]);
    const replies = await forget(dep, { deadlineTs: deadline(), rolloutIds: ['b', 'a', 'b', 'c.1', 'a'] });
    const forgets = callsOf('forget');
    expect(forgets.slice(0, 2).map((c) => c.server)).toEqual(['env', 'agent']);
    expect(
      forgets
        .slice(2)
        .map((c) => c.server)
        .sort(),
    ).toEqual(['policy', 'res']);
    for (const c of forgets) expect(c.body).toEqual({ checkpoint_id: 'forget', deadline_ts: expect.any(Number), rollout_ids: ['a', 'b', 'c.1'] });
    expect(replies.env).toEqual({ forgotten_count: 3 });
    expect(replies.policy).toEqual({ forgotten_count: 2, forgotten: ['a', 'b'] });
  });
});

describe('discover', () => {
  it('skips 404s, sorts members by (prepare stage, name), keeps statuses', async () => {
    const a = await fake('z_env', 'environment');
    const b = await fake('a_res', 'resources');
    const c = await fake('policy', 'model');
    const d = await fake('b_agent', 'agent');
    const e = await fake('a_env', 'environment');
    const judge = await fake('judge', 'model', (op) => (op === 'status' ? { status: 404, body: { message: 'Not Found' } } : undefined));
    const servers = [a, b, c, judge, d, e].map(({ name, url }) => ({ name, url }));
    const result = await discover({ servers, token: TOKEN, pool });
    expect(result.members.map((m) => m.name)).toEqual(['a_env', 'z_env', 'policy', 'b_agent', 'a_res']);
    expect(result.members[2]).toEqual({ name: 'policy', url: c.url, kind: 'model' });
    expect(result.skipped).toEqual(['judge']);
    expect(result.statuses.a_res!.kind).toBe('resources');
    expect(result.statuses.a_res!.report.blocker_count).toBe(0);
    for (const call of callsOf('status')) {
      expect(call.method).toBe('GET');
      expect(call.headers.authorization).toBe(`Bearer ${TOKEN}`);
      expect(call.headers['content-type']).toBe('application/json');
    }
  });

  it('fails listing every failed server: unknown kind, non-200, silence, refused', async () => {
    const policy = await fake('policy', 'model');
    const odd = await fake('odd', 'controller');
    const locked = await fake('locked', 'agent', (op) =>
      op === 'status' ? { status: 401, body: { error: { code: 'unauthorized', detail: 'bad token' } } } : undefined,
    );
    const silent = await silentServer();
    const refused = await refusedUrl();
    const started = Date.now();
    const err = await discover({
      servers: [
        { name: 'policy', url: policy.url },
        { name: 'odd', url: odd.url },
        { name: 'locked', url: locked.url },
        { name: 'silent', url: silent },
        { name: 'refused', url: refused },
      ],
      token: TOKEN,
      pool,
      probeTimeoutMs: 300,
      retryDelayMs: 10,
    }).catch((e) => e);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(err.operation).toBe('discover');
    expect(Object.keys(err.failures).sort()).toEqual(['locked', 'odd', 'refused', 'silent']);
    expect(err.failures.odd.detail).toContain('unknown participant kind');
    expect(err.failures.locked.description).toBe('HTTP 401 unauthorized bad token');
    expect(err.failures.silent.detail).toBe('no status reply within 0.3 seconds');
    expect(err.failures.silent.timeout).toBe(true);
    expect(err.failures.refused.transport).toBe(true);
    expect(err.failures.refused.detail).toMatch(/ECONNREFUSED.*after 3 tries/);
  });

  it('retries connection errors, 3 tries in all', async () => {
    const policy = await fake('policy', 'model');
    const slam = await slammingServer();
    const err = await discover({
      servers: [
        { name: 'policy', url: policy.url },
        { name: 'slam', url: slam.url },
      ],
      token: TOKEN,
      pool,
      retryDelayMs: 10,
    }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(Object.keys(err.failures)).toEqual(['slam']);
    expect(slam.connections()).toBe(3);
    expect(isTransient(err)).toBe(true);
  });

  it('requires a policy model unless told otherwise', async () => {
    const env = await fake('env', 'environment');
    const servers = [{ name: 'env', url: env.url }];
    const err = await discover({ servers, token: TOKEN, pool }).catch((e) => e);
    expect(err).toBeInstanceOf(CoordinationError);
    expect(err.message).toBe(NO_MODEL_MESSAGE);
    expect(err.failures).toEqual({});
    expect(isTransient(err)).toBe(false);
    const ok = await discover({ servers, token: TOKEN, pool, requireModel: false });
    expect(ok.members.map((m) => m.name)).toEqual(['env']);
  });
});
