// Multi-worker servers as real processes (docs/multi-worker.md): every Gym server of the counter
// topology runs `workers: 2` behind its one URL. Each is one participant (one status, one
// identity, one manifest); every call of an episode reaches the worker that owns its rollout; a
// checkpoint mid-episode restores into fresh multi-worker servers and the continued episode
// reaches reward 1.0 with only the calls after its saved turn; SIGKILL of one worker takes the
// whole server down, and it comes back as a new instance.
import { join } from 'node:path';
import { Client, request } from 'undici';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { CONTROL_PREFIX } from '../../../protocol/control.js';
import { groupAlive } from '../../../servers/launcher/group-liveness.js';
import { prepare, resume } from '../../../activities/coordination.js';
import { killDeployment, restartDeployment } from '../../../servers/launcher/launcher.js';
import { readRunState } from '../../../servers/launcher/run-dir.js';
import { WORKER_METRICS_PATH } from '../../../servers/common/metrics.js';
import { ownerOf } from '../../../servers/workers/owner.js';
import { runtimeDirOf, workerPid } from '../../../servers/workers/spawn-workers.js';
import { ControlLink } from '../../../servers/workers/control-link.js';
import { waitFor } from '../../helpers/wait.js';
import {
  baseline,
  bringUp,
  cleanSlate,
  crashAndRestore,
  deadline,
  episode,
  forgetRollouts,
  nMessages,
  participants,
  prepareAndCommit,
  readRecords,
  replyOf,
  rewardOf,
  runEpisode,
  solvedCounter,
  startRun,
  status,
  tearDown,
  TOKEN,
  type Gym,
  type Status,
} from './harness.js';

const ENV = 'counter_env';
const GYM_SERVERS = ['counter_env', 'simple_agent', 'counter', 'policy_model'];
let gym: Gym | undefined;
const g = (): Gym => gym!;

beforeAll(async () => {
  gym = await bringUp('counter-workers');
});
afterAll(async () => {
  await tearDown(gym);
});
beforeEach(async () => {
  await cleanSlate(g());
});

const frontPid = (server: string): number => readRunState(g().runDir).servers[server]!.pid!;

function runtimeDir(server: string): string {
  const dir = runtimeDirOf(frontPid(server));
  if (!dir) throw new Error(`no runtime directory of ${server}`);
  return dir;
}

/** Each worker's own status, straight from its socket (the server's URL answers only as a whole). */
async function workerStatuses(server: string): Promise<Status[]> {
  const dir = runtimeDir(server);
  const out: Status[] = [];
  for (const i of [0, 1]) {
    const link = new ControlLink(join(dir, `w${i}.sock`));
    try {
      const r = await link.call('GET', `${CONTROL_PREFIX}/status`, { authorization: `Bearer ${TOKEN}` });
      out.push(JSON.parse(r.text) as Status);
    } finally {
      await link.close();
    }
  }
  return out;
}

describe('servers with workers: 2', () => {
  it('each server is one participant, and every call of an episode reaches the worker that owns its rollout', async () => {
    const { task, rollout } = solvedCounter(g(), 'route');
    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const owner = ownerOf(rollout, 2);
    const live: Record<string, string> = { counter_env: 'episodes', simple_agent: 'sessions', counter: 'sessions', policy_model: 'inflight' };
    for (const server of GYM_SERVERS) {
      const whole = await status(g(), server);
      expect(whole).toMatchObject({ workers: 2, expected_workers: 2, phase: 'idle' });
      expect(whole.report.counts[live[server]!]).toBe(1);
      const parts = await workerStatuses(server);
      // The episode's state is on its owner only; every worker carries the server's one identity.
      expect(
        parts.map((p) => p.report.counts[live[server]!]),
        server,
      ).toEqual(owner === 0 ? [1, 0] : [0, 1]);
      for (const p of parts) expect(p.instance_id).toBe(whole.instance_id);
    }
    await g().backend.reset();
    await g().backend.release();
    expect(rewardOf(await replyOf(run))).toBe(1);
    await forgetRollouts(g(), [rollout]);
  });

  it('a kept connection carries on to the worker that owns each request: its own served there, another relayed to its owner and the connection closed', async () => {
    // Two rollouts owned by different workers, sent one after the other on one connection.
    const ids = Array.from({ length: 20 }, (_, i) => `kept-${i}`);
    const a = ids.find((id) => ownerOf(id, 2) === 0)!;
    const b = ids.find((id) => ownerOf(id, 2) === 1)!;
    // A request that gets no answer fails at its own line instead of the test's timeout (CI saw
    // this test time out once under load; which request hung was not known).
    const answerWithin = { headersTimeout: 20_000, bodyTimeout: 20_000 };
    const client = new Client(g().endpoints.counter!.url, { pipelining: 1, ...answerWithin });
    const headers = { 'content-type': 'application/json' };
    const cookies: string[] = [];
    try {
      const first = await client.request({ method: 'POST', path: `/ng-rollout/${a}/seed_session`, headers, body: '{}' });
      cookies.push(String(first.headers['set-cookie']).split(';')[0]!);
      await first.body.text();
      expect(first.statusCode).toBe(200);
      expect(first.headers.connection).toBe('keep-alive'); // kept: the next request may come on it
      const second = await client.request({ method: 'POST', path: `/ng-rollout/${b}/seed_session`, headers, body: '{}' });
      cookies.push(String(second.headers['set-cookie']).split(';')[0]!);
      await second.body.text();
      expect(second.statusCode).toBe(200);
      expect(second.headers.connection).toBe('close'); // relayed: the caller's next request goes through the front
      const parts = await workerStatuses('counter');
      expect(parts.map((p) => p.report.counts.sessions)).toEqual([1, 1]);
      // A control call on a connection kept by a worker reaches the server's one participant (the
      // front), not that worker's own control plane; the connection closes after it.
      const third = await client.request({ method: 'POST', path: `/ng-rollout/${a}/seed_session`, headers, body: '{}' });
      cookies.push(String(third.headers['set-cookie']).split(';')[0]!);
      await third.body.text();
      expect(third.headers.connection).toBe('keep-alive');
      const st = await client.request({ method: 'GET', path: `${CONTROL_PREFIX}/status`, headers: { authorization: `Bearer ${TOKEN}` } });
      const body = (await st.body.json()) as Status & { workers?: number };
      expect(st.statusCode).toBe(200);
      expect(body.workers).toBe(2);
      expect(body.report.counts.sessions).toBe(3);
      expect(st.headers.connection).toBe('close');
    } finally {
      await client.close();
      // The sessions go with their cookies (the next test starts clean).
      for (const [i, id] of [a, b, a].entries()) {
        const closed = await request(`${g().endpoints.counter!.url}/ng-rollout/${id}/close_session`, {
          ...answerWithin,
          method: 'POST',
          headers: { ...headers, cookie: cookies[i] ?? '' },
          body: '{}',
        });
        await closed.body.text();
      }
    }
  });

  it('a checkpoint mid-episode: one records file per server; restored into fresh multi-worker servers, the episode continues from its saved turn', async () => {
    const { task, rollout } = solvedCounter(g(), 'mw');
    const base = await baseline(g(), ENV, rollout, task);
    expect(base.reward).toBe(1);
    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const ckpt = await prepareAndCommit(g(), 'ckpt-mw', [episode(rollout)]);
    // The server's /metrics adds up its workers': the one record, exported by its owner alone; the
    // phase the workers are in; the process metrics of all three processes.
    const metrics = await scrape(g().url('simple_agent'));
    expect(metrics).toMatch(/^gym_records_exported_total 1$/m);
    expect(metrics).toMatch(new RegExp(`^gym_control_phase\\{phase="${(await status(g(), 'simple_agent')).phase}"\\} 1$`, 'm'));
    expect(metrics).toMatch(/^gym_episodes_in_flight 1$/m);
    expect(Number(/^nodejs_heap_size_used_bytes (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
    expect((await request(`${g().url('simple_agent')}${WORKER_METRICS_PATH}`)).statusCode).toBe(404);
    const data = task.task_input.task_data as { initial_count: number };
    const firstIncrement = base.calls[0]!.action === 'inc1' ? 1 : base.calls[0]!.action === 'inc2' ? 2 : 3;
    expect(readRecords(ckpt.dir, 'resources', 'counter')).toMatchObject([
      { episode_id: { rollout_id: rollout, attempt: 0 }, state: { count: data.initial_count + firstIncrement } },
    ]);
    for (const [kind, name] of [
      ['agent', 'simple_agent'],
      ['environment', 'counter_env'],
      ['model', 'policy_model'],
    ]) {
      expect(readRecords(ckpt.dir, kind!, name!).map((r) => r.episode_id)).toEqual([{ rollout_id: rollout, attempt: 0 }]);
    }
    const before = Object.fromEntries(await Promise.all(GYM_SERVERS.map(async (s) => [s, (await status(g(), s)).instance_id])));
    await crashAndRestore(g(), [run], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-mw' });
    for (const s of GYM_SERVERS) expect((await status(g(), s)).instance_id).not.toBe(before[s]);
    expect(rewardOf(await runEpisode(g(), ENV, episode(rollout, 1), task))).toBe(1);
    expect(nMessages(await g().backend.calls())).toEqual([...base.nMessages.slice(0, 2), ...base.nMessages.slice(1)]);
    await forgetRollouts(g(), [rollout]);
  });

  it('a model call whose caller went away while its reply was held by a checkpoint leaves nothing behind (chaos seed 904 with workers)', async () => {
    const { task, rollout } = solvedCounter(g(), 'gone');
    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const dep = await participants(g());
    expect((await prepare(dep, { checkpointId: 'ck-gone', deadlineTs: deadline() })).prepared).toBe(true);
    // The caller (the agent) dies; the model's reply, released by the backend, has nobody to go to.
    await killDeployment(g().runDir, { servers: ['simple_agent'] });
    await g().backend.release();
    await resume(await participants(g(), { exclude: ['simple_agent'] }), { checkpointId: 'ck-gone', deadlineTs: deadline() });
    await waitFor('the model to hold nothing', async () => {
      const st = await status(g(), 'policy_model');
      return st.report.blockers.length === 0 && st.report.counts.inflight === 0 && st.report.counts.held === 0;
    });
    await restartDeployment(g().runDir, { env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' }, servers: ['simple_agent'] });
    await run.done;
    await forgetRollouts(g(), [rollout]);
  });

  it('SIGKILL of one worker takes its whole server down; restarted, it is a new instance and serves again', async () => {
    const { task, rollout } = solvedCounter(g(), 'kill');
    const before = await status(g(), 'simple_agent');
    const pid = frontPid('simple_agent');
    const worker = workerPid(pid, 1)!;
    process.kill(worker, 'SIGKILL');
    await waitFor('the agent server to go down', async () => !groupAlive(pid, 'simple_agent'));
    await restartDeployment(g().runDir, { env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' }, servers: ['simple_agent'] });
    const after = await status(g(), 'simple_agent');
    expect(after.instance_id).not.toBe(before.instance_id);
    expect(after.workers).toBe(2);
    expect(rewardOf(await runEpisode(g(), ENV, episode(rollout), task))).toBe(1);
    await forgetRollouts(g(), [rollout]);
  });
});

async function scrape(url: string): Promise<string> {
  const res = await request(`${url}/metrics`);
  expect(res.statusCode).toBe(200);
  return res.body.text();
}
