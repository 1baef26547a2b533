// The controller's activities run in a MockActivityEnvironment: Gym coordination against
// in-process memory participants on 127.0.0.1, `/run` against a small fake environment server,
// and the small ones (metrics, dataloader).
import { createHash } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { CancelledFailure } from '@temporalio/common';
import type { FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { topologyFingerprint } from '../../activities/gym.js';
import { closeActivityPools, createActivities, createActivityPools } from '../../activities/index.js';
import { writeLedgerPart } from '../../activities/controller-files.js';
import { packJson } from '../../protocol/packed-json.js';
import { allocateSnapshot, finalizeSnapshot, validateSnapshot } from '../../activities/snapshots.js';
import { taskAt } from '../../activities/dataset.js';
import {
  GYM_COMMIT_FILE,
  type CheckpointOutcome,
  type GymCommitFile,
  type GymTopology,
  type RolloutReport,
  type RunEpisodeInput,
  type SnapshotManifestSlim,
} from '../../protocol/controller.js';
import type { Kind } from '../../protocol/ids.js';
import { buildMemoryServer, type MemoryParticipant } from '../participants/memory-participant.js';
import { tempDir } from '../helpers/temp-dir.js';
import { failureOf, mockEnv, runActivity } from '../helpers/activity.js';

const TOKEN = 'activities-test-token';
const pools = createActivityPools();
const acts = createActivities({ controlToken: TOKEN, pools, log: () => {} });

let tmp: string;
const apps: FastifyInstance[] = [];
const httpServers: http.Server[] = [];

beforeEach(() => {
  tmp = tempDir('controller-activities');
});
afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
  await Promise.all(
    httpServers.splice(0).map(
      (s) =>
        new Promise<void>((r) => {
          s.closeAllConnections();
          s.close(() => r());
        }),
    ),
  );
});
afterAll(async () => {
  await closeActivityPools(pools);
});

async function memory(name: string, kind: Kind): Promise<{ url: string; participant: MemoryParticipant }> {
  const { app, participant } = await buildMemoryServer({ instance: name, kind, token: TOKEN });
  await app.listen({ host: '127.0.0.1', port: 0 });
  apps.push(app);
  return { url: `http://127.0.0.1:${(app.server.address() as net.AddressInfo).port}`, participant };
}

async function refusedUrl(): Promise<string> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return `http://127.0.0.1:${port}`;
}

/** An environment and a resources participant, discovered through endpoints.json. */
async function gym(): Promise<{ topology: GymTopology; env: MemoryParticipant; res: MemoryParticipant }> {
  const env = await memory('env_main', 'environment');
  const res = await memory('res_main', 'resources');
  const runDir = path.join(tmp, 'run');
  await fsp.mkdir(runDir);
  await fsp.writeFile(
    path.join(runDir, 'endpoints.json'),
    JSON.stringify({
      env_main: { kind: 'environment', url: env.url },
      res_main: { kind: 'resources', url: res.url },
      // Never probed: inference servers take no part in checkpoints.
      llm: { kind: 'inference', url: await refusedUrl() },
    }),
  );
  const topology = await runActivity(acts.discoverGym, { runDir });
  return { topology, env: env.participant, res: res.participant };
}

describe('discoverGym', () => {
  it('probes every server but inference ones and fingerprints the members', async () => {
    const { topology } = await gym();
    expect(topology.members.map((m) => [m.name, m.kind])).toEqual([
      ['env_main', 'environment'],
      ['res_main', 'resources'],
    ]);
    expect(Object.keys(topology.servers).sort()).toEqual(['env_main', 'llm', 'res_main']);
    expect(topology.servers.llm!.kind).toBe('inference');
    expect(topology.fingerprint).toBe(topologyFingerprint(topology.members));
    expect(topology.fingerprint).toMatch(/^[0-9a-f]{64}$/);
  });

  it('fails for good without a model when one is required, and retryably on a missing endpoints file', async () => {
    const { topology } = await gym();
    const f = await failureOf(runActivity(acts.discoverGym, { runDir: path.join(tmp, 'run'), requireModel: true }));
    expect(f.type).toBe('invariant_error');
    expect(f.nonRetryable).toBe(true);
    expect(f.message).toMatch(/no policy model/);
    const g = await failureOf(runActivity(acts.discoverGym, { runDir: path.join(tmp, 'nowhere') }));
    expect(g.type).toBe('storage_error');
    expect(g.nonRetryable).toBe(false);
    expect(topology.members).toHaveLength(2);
  });
});

describe('discoverGym of a server that is gone', () => {
  it('names it unreachable and refused (nothing listens): a crash, not a busy Gym', async () => {
    const env = await memory('env_main', 'environment');
    const runDir = path.join(tmp, 'gone');
    await fsp.mkdir(runDir);
    await fsp.writeFile(
      path.join(runDir, 'endpoints.json'),
      JSON.stringify({ env_main: { kind: 'environment', url: env.url }, res_main: { kind: 'resources', url: await refusedUrl() } }),
    );
    const f = await failureOf(runActivity(acts.discoverGym, { runDir }));
    expect(f.type).toBe('gym_transient');
    expect(f.details?.[0]).toMatchObject({ operation: 'discover', unreachable: ['res_main'], refused: ['res_main'] });
  });
});

describe('Gym coordination activities', () => {
  it('prepare (not ready, then ready), commit, validate into a snapshot, resume', async () => {
    const { topology, env, res } = await gym();
    env.upsert('r1', { atBoundary: false, payload: { turn: 1 } });
    env.upsert('r2', { atBoundary: true, payload: { turn: 2 } });
    res.upsert('r1', { atBoundary: true, payload: { rev: 1 } });

    const notReady = await runActivity(acts.gymPrepare, { topology, checkpointId: 'ckpt-a', timeoutS: 0.3 });
    expect(notReady.prepared).toBe(false);
    expect(notReady.blockers).toEqual({ env_main: ['r1'] });
    await runActivity(acts.gymResume, { topology, checkpointId: 'ckpt-a', timeoutS: 10 });

    env.upsert('r1', { atBoundary: true });
    env.upsert('r3', { restart: true });
    const prep = await runActivity(acts.gymPrepare, { topology, checkpointId: 'ckpt-b', timeoutS: 10 });
    expect(prep).toMatchObject({ checkpointId: 'ckpt-b', prepared: true, restarts: ['r3'], blockers: {} });
    expect(prep.seconds).toBeGreaterThanOrEqual(0);

    const loc = await allocateSnapshot({ checkpointDir: path.join(tmp, 'ckpt'), anchor: 'bootstrap', checkpointId: 'ckpt-b' });
    const scope = [
      { rollout_id: 'r1', attempt: 0 },
      { rollout_id: 'r2', attempt: 0 },
    ];
    const committed = await runActivity(acts.gymCommit, { topology, checkpointId: 'ckpt-b', timeoutS: 10, checkpointDir: loc.tmpDir, scope });
    // Both scope episodes were committed by the environment; the episode lists stay on disk.
    expect(committed.uncommitted).toEqual([]);
    expect(Object.keys(committed.participants).sort()).toEqual(['env_main', 'res_main']);
    expect(committed.participants.res_main).toEqual(expect.objectContaining({ kind: 'resources', instance: 'res_main', episode_count: 1 }));
    expect(committed.participants.res_main).not.toHaveProperty('episode_ids');
    expect(committed.participants.env_main!.manifest.checkpoint_id).toBe('ckpt-b');
    const commitFile = JSON.parse(await fsp.readFile(path.join(loc.tmpDir, GYM_COMMIT_FILE), 'utf8')) as GymCommitFile;
    expect(commitFile).toMatchObject({ checkpoint_id: 'ckpt-b', scope: ['r1', 'r2'] });
    expect(commitFile.participants.res_main!.episode_ids).toEqual(['r1']);
    expect(commitFile.participants.env_main!.episode_ids).toEqual(['r1', 'r2']);

    const renewed = await runActivity(acts.gymRenew, { topology, checkpointId: 'ckpt-b', timeoutS: 60 });
    expect(Object.keys(renewed.leases).sort()).toEqual(['env_main', 'res_main']);

    // The commit result, checked against the commit file, is what the snapshot manifest records,
    // with the file's digest; it validates against the disk.
    const cut = await writeLedgerPart({ dir: loc.tmpDir, shard: 0, ledger: packJson({ cursor: 1 }) });
    const slim: SnapshotManifestSlim = {
      schema_version: 2,
      format: 'rollout-checkpoint/ts',
      run: 'run-1',
      checkpoint_id: 'ckpt-b',
      sequence: loc.sequence,
      base_train_step: 0,
      trainer_version: 0,
      dataloader_cursor: 1,
      gym_topology_fingerprint: topology.fingerprint,
      gym_checkpoint: { restarts: prep.restarts, participants: committed.participants },
      ledger_parts: [cut],
      created_at: new Date().toISOString(),
    };
    const published = await finalizeSnapshot({ location: loc, manifest: slim, fingerprint: topology.fingerprint });
    const manifest = await validateSnapshot({ dir: published, fingerprint: topology.fingerprint });
    expect(manifest.gym_checkpoint.participants.res_main).toMatchObject({ kind: 'resources', instance: 'res_main', episode_count: 1 });
    expect(manifest.gym_checkpoint.participants.env_main!.manifest).toEqual(committed.participants.env_main!.manifest);
    const commitText = await fsp.readFile(path.join(published, GYM_COMMIT_FILE));
    expect(manifest.gym_checkpoint.commit_file).toEqual({
      file: GYM_COMMIT_FILE,
      sha256: createHash('sha256').update(commitText).digest('hex'),
      bytes: commitText.length,
    });
    expect(JSON.parse(commitText.toString())).toMatchObject({ scope: ['r1', 'r2'] });

    // A commit of the same ID with another scope is refused: non-retryable, typed by its code.
    const conflict = await failureOf(
      runActivity(acts.gymCommit, { topology, checkpointId: 'ckpt-b', timeoutS: 10, checkpointDir: loc.tmpDir, scope: scope.slice(0, 1) }),
    );
    expect(conflict.type).toBe('checkpoint_conflict');
    expect(conflict.nonRetryable).toBe(true);
    expect(Object.keys((conflict.details![0] as { failures: Record<string, string> }).failures).sort()).toEqual(['env_main', 'res_main']);

    const resumed = await runActivity(acts.gymResume, { topology, checkpointId: 'ckpt-b', timeoutS: 10 });
    expect(resumed.idempotent).toEqual([]);
    expect(env.plane.currentPhase).toBe('idle');
    const again = await runActivity(acts.gymResume, { topology, checkpointId: 'ckpt-b', timeoutS: 10 });
    expect(again.idempotent).toEqual(['env_main', 'res_main']);
  });

  it('the commit invariants are checked here, once: a commit that does not match the topology is an invariant_error', async () => {
    const { topology } = await gym();
    await runActivity(acts.gymPrepare, { topology, checkpointId: 'ckpt-i', timeoutS: 10 });
    // The resources server commits as what it is; the topology says it was discovered as an agent.
    const wrong = { ...topology, members: topology.members.map((m) => (m.name === 'res_main' ? { ...m, kind: 'agent' as const } : m)) };
    const f = await failureOf(
      runActivity(acts.gymCommit, { topology: wrong, checkpointId: 'ckpt-i', timeoutS: 10, checkpointDir: path.join(tmp, 'i'), scope: [] }),
    );
    expect(f.type).toBe('invariant_error');
    expect(f.nonRetryable).toBe(true);
    expect(f.message).toMatch(/res_main: manifest kind "resources", discovered agent/);
  });

  it('a scope naming a restart is refused as restart_in_scope', async () => {
    const { topology, env } = await gym();
    env.upsert('r1', { atBoundary: true, restart: true });
    const prep = await runActivity(acts.gymPrepare, { topology, checkpointId: 'ckpt-r', timeoutS: 10 });
    expect(prep.restarts).toEqual(['r1']);
    const f = await failureOf(
      runActivity(acts.gymCommit, {
        topology,
        checkpointId: 'ckpt-r',
        timeoutS: 10,
        checkpointDir: path.join(tmp, 'c'),
        scope: [{ rollout_id: 'r1', attempt: 0 }],
      }),
    );
    expect(f.type).toBe('restart_in_scope');
    expect(f.nonRetryable).toBe(true);
  });

  it('a wrong token is refused for good (unauthorized)', async () => {
    const { topology } = await gym();
    const other = createActivities({ controlToken: 'wrong-token', pools, log: () => {} });
    const f = await failureOf(runActivity(other.gymPrepare, { topology, checkpointId: 'ckpt-x', timeoutS: 5 }));
    expect(f.type).toBe('unauthorized');
    expect(f.nonRetryable).toBe(true);
  });

  it('a dead server is a retryable gym_transient failure', async () => {
    const { topology } = await gym();
    const dead = { name: 'res_dead', kind: 'resources' as const, url: await refusedUrl() };
    const withDead: GymTopology = { ...topology, members: [...topology.members, dead] };
    const f = await failureOf(runActivity(acts.gymPrepare, { topology: withDead, checkpointId: 'ckpt-d', timeoutS: 5 }));
    expect(f.type).toBe('gym_transient');
    expect(f.nonRetryable).toBe(false);
    const details = f.details![0] as { operation: string; failures: Record<string, string> };
    expect(details.operation).toBe('prepare');
    expect(Object.keys(details.failures)).toEqual(['res_dead']);
    await runActivity(acts.gymResume, { topology, checkpointId: 'ckpt-d', timeoutS: 10 });

    const g = await failureOf(runActivity(acts.gymRetire, { topology: withDead, timeoutS: 5, episodes: [{ rollout_id: 'r9', attempt: 0 }] }));
    expect(g.type).toBe('gym_transient');
  });

  it('retire and forget go through every member', async () => {
    const { topology, env, res } = await gym();
    env.upsert('r1', { atBoundary: true });
    res.upsert('r1', { atBoundary: true });
    const retired = await runActivity(acts.gymRetire, { topology, timeoutS: 10, episodes: [{ rollout_id: 'r1', attempt: 0 }] });
    expect(Object.keys(retired.retired).sort()).toEqual(['env_main', 'res_main']);
    expect(env.episodes.size).toBe(0);
    const forgotten = await runActivity(acts.gymForget, { topology, timeoutS: 10, rolloutIds: ['r1', 'r1'] });
    expect(Object.keys(forgotten.forgotten).sort()).toEqual(['env_main', 'res_main']);
    expect(await runActivity(acts.gymForget, { topology, timeoutS: 10, rolloutIds: [] })).toMatchObject({ forgotten: {} });
  });

  it('restore installs the replacements into fresh participants', async () => {
    const first = await gym();
    first.env.upsert('r1', { atBoundary: true, payload: 'p1' });
    await runActivity(acts.gymPrepare, { topology: first.topology, checkpointId: 'ckpt-s', timeoutS: 10 });
    const dir = path.join(tmp, 'snap');
    await runActivity(acts.gymCommit, {
      topology: first.topology,
      checkpointId: 'ckpt-s',
      timeoutS: 10,
      checkpointDir: dir,
      scope: [{ rollout_id: 'r1', attempt: 0 }],
    });
    await Promise.all(apps.splice(0).map((a) => a.close()));

    await fsp.rm(path.join(tmp, 'run'), { recursive: true });
    const second = await gym();
    expect(second.topology.fingerprint).toBe(first.topology.fingerprint);
    const restored = await runActivity(acts.gymRestore, {
      topology: second.topology,
      restoreId: 'restore-1',
      timeoutS: 10,
      checkpointDir: dir,
      scope: [{ rollout_id: 'r1', attempt: 0 }],
      sourceCheckpointId: 'ckpt-s',
    });
    expect(restored.restored).toEqual({ env_main: ['r1-a1'], res_main: [] });
    expect(second.env.episodes.get('r1-a1')?.payload).toBe('p1');
    await runActivity(acts.gymResume, { topology: second.topology, checkpointId: 'restore-1', timeoutS: 10 });
  });
});

// --- runEpisode --------------------------------------------------------------------------------

interface FakeEnv {
  url: string;
  requests: { rollout: string; body: any }[];
  /** Resolves when the socket of a held request closes. */
  closed: Promise<void>;
  received: Promise<void>;
}

/** An environment `/run` whose answer is chosen by the rollout ID. */
async function fakeEnvironment(): Promise<FakeEnv> {
  const requests: FakeEnv['requests'] = [];
  let onClosed!: () => void;
  let onReceived!: () => void;
  const closed = new Promise<void>((r) => (onClosed = r));
  const received = new Promise<void>((r) => (onReceived = r));
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c: Buffer) => (raw += c.toString('utf8')));
    req.on('end', () => {
      const body = JSON.parse(raw) as { episode_id: { rollout_id: string; attempt: number }; task: any };
      const rollout = body.episode_id.rollout_id;
      requests.push({ rollout, body });
      onReceived();
      const send = (status: number, payload: unknown): void => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(payload));
      };
      const reply = { episode_id: body.episode_id, task_id: body.task.task_id };
      switch (rollout) {
        case 'ok':
          return send(200, {
            ...reply,
            result: { reward: 0.75, response: { output: 'x'.repeat(10_000) }, ng_trajectory: [1, 2, 3], agent_timed_out: false, failure_kind: null },
            failure: null,
          });
        case 'fail':
          return send(200, {
            ...reply,
            result: null,
            failure: { failure_reason: 'the agent crashed', terminal: true, stage: 'agent', failure_kind: 'agent_error' },
          });
        case 'stale':
          return send(409, { error: { code: 'stale_attempt', detail: 'attempt 0 of stale was retired' } });
        case 'closed':
          return send(409, { error: { code: 'admission_closed', detail: 'a checkpoint is open' } });
        case 'bad':
          return send(400, { error: { code: 'invalid_request', detail: 'no' } });
        case 'boom':
          res.writeHead(503, { 'content-type': 'text/plain' });
          return res.end('Service Unavailable');
        case 'hang':
          res.on('close', () => onClosed());
          return; // never answers
        default:
          return send(500, {});
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  httpServers.push(server);
  return { url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`, requests, closed, received };
}

function input(url: string, rollout: string, attempt = 0): RunEpisodeInput {
  return { run: 'run-1', environment: 'env_main', environmentUrl: url, episode: { rollout_id: rollout, attempt }, task: taskAt(1, 0) };
}

describe('runEpisode', () => {
  it('maps a result to completed with a small summary', async () => {
    const fake = await fakeEnvironment();
    const env = mockEnv();
    const beats: unknown[] = [];
    env.on('heartbeat', (d: unknown) => beats.push(d));
    const report = (await env.run(acts.runEpisode, input(fake.url, 'ok', 2))) as RolloutReport;
    expect(report).toMatchObject({
      captureKey: 'ok-a2',
      episode: { rollout_id: 'ok', attempt: 2 },
      status: 'completed',
      reward: 0.75,
      terminal: false,
      result: { reward: 0.75, agent_timed_out: false, failure_kind: null },
    });
    expect(report.result).not.toHaveProperty('response');
    expect(report.result).not.toHaveProperty('ng_trajectory');
    expect(report.seconds).toBeGreaterThanOrEqual(0);
    expect(beats).toEqual([]); // a call that ends within the heartbeat interval sends none
    expect(fake.requests[0]!.body).toEqual({ episode_id: { rollout_id: 'ok', attempt: 2 }, task: taskAt(1, 0) });
  });

  it('maps a handled failure to failed, terminal as reported', async () => {
    const fake = await fakeEnvironment();
    const report = await runActivity(acts.runEpisode, input(fake.url, 'fail'));
    expect(report).toMatchObject({
      captureKey: 'fail',
      status: 'failed',
      reward: null,
      terminal: true,
      reason: 'the agent crashed',
      result: { stage: 'agent', failure_kind: 'agent_error' },
    });
  });

  it('stale_attempt is non-retryable; admission_closed is retryable after a short delay', async () => {
    const fake = await fakeEnvironment();
    const stale = await failureOf(runActivity(acts.runEpisode, input(fake.url, 'stale')));
    expect(stale.type).toBe('stale_attempt');
    expect(stale.nonRetryable).toBe(true);
    const closed = await failureOf(runActivity(acts.runEpisode, input(fake.url, 'closed')));
    expect(closed.type).toBe('gym_transient');
    expect(closed.nonRetryable).toBe(false);
    expect(closed.nextRetryDelay).toBeDefined();
    const bad = await failureOf(runActivity(acts.runEpisode, input(fake.url, 'bad')));
    expect(bad.type).toBe('invalid_request');
    expect(bad.nonRetryable).toBe(true);
  });

  it('5xx and transport errors are retryable gym_transient', async () => {
    const fake = await fakeEnvironment();
    const boom = await failureOf(runActivity(acts.runEpisode, input(fake.url, 'boom')));
    expect(boom.type).toBe('gym_transient');
    expect(boom.nonRetryable).toBe(false);
    expect(boom.message).toMatch(/HTTP 503/);
    const dead = await failureOf(runActivity(acts.runEpisode, input(await refusedUrl(), 'ok')));
    expect(dead.type).toBe('gym_transient');
    expect(dead.nonRetryable).toBe(false);
  });

  it('cancellation aborts the HTTP request and surfaces as the cancellation', async () => {
    const fake = await fakeEnvironment();
    const env = mockEnv();
    const p = env.run(acts.runEpisode, input(fake.url, 'hang'));
    const outcome = p.then(
      () => 'resolved',
      (e: unknown) => e,
    );
    await fake.received;
    env.cancel();
    const err = await outcome;
    expect(err).toBeInstanceOf(CancelledFailure);
    await fake.closed; // the fake server saw the socket close
  });
});

// --- metrics and dataloader ------------------------------------------------------------------------

describe('appendCheckpointMetrics', () => {
  it('appends one JSON line per outcome', async () => {
    const checkpointDir = path.join(tmp, 'ckpt');
    const outcome = (id: string): CheckpointOutcome => ({
      checkpointId: id,
      trigger: 'periodic',
      outcome: 'completed',
      reason: 'completed',
      seconds: { prepare: 0.1, total: 1 },
      at: '2026-01-01T00:00:00.000Z',
    });
    await runActivity(acts.appendCheckpointMetrics, { checkpointDir, outcome: outcome('a') });
    await runActivity(acts.appendCheckpointMetrics, { checkpointDir, outcome: outcome('b') });
    const lines = (await fsp.readFile(path.join(checkpointDir, 'checkpoint_metrics.jsonl'), 'utf8')).split('\n');
    expect(lines).toHaveLength(3);
    expect(lines[2]).toBe('');
    expect(JSON.parse(lines[1]!)).toEqual(outcome('b'));
  });
});

describe('loadPromptGroups', () => {
  it('returns the groups with their sibling tasks and the next cursor', async () => {
    const batch = await runActivity(acts.loadPromptGroups, { seed: 3, cursor: 2, groups: 3, groupSize: 2, tasksets: ['genrm', 'counter'] });
    expect(batch.cursor).toBe(5);
    expect(batch.groups.map((g) => [g.group_id, g.prompt_index, g.taskset, g.tasks.length])).toEqual([
      ['s3-p2', 2, 'genrm', 2],
      ['s3-p3', 3, 'counter', 2],
      ['s3-p4', 4, 'genrm', 2],
    ]);
    const genrm = batch.groups[0]!;
    expect(genrm.prompt_id).toBe(genrm.tasks[0]!.task_id.task_id);
    expect(genrm.tasks.map((t) => t.task_input.task_data._ng_rollout_index)).toEqual([0, 1]);
    expect(genrm.tasks[1]!.task_input.task_data).toMatchObject({ _ng_group_id: 's3-p2', _ng_group_attempt: 0 });
    expect(batch.groups[1]!.tasks[0]!.task_input.task_data).not.toHaveProperty('_ng_group_id');
    // Deterministic: the same cursor gives the same batch.
    expect(await runActivity(acts.loadPromptGroups, { seed: 3, cursor: 2, groups: 3, groupSize: 2, tasksets: ['genrm', 'counter'] })).toEqual(batch);
  });

  it('refuses impossible arguments for good', async () => {
    const f = await failureOf(runActivity(acts.loadPromptGroups, { seed: 1, cursor: -1, groups: 1, groupSize: 1 }));
    expect(f.type).toBe('invariant_error');
  });
});
