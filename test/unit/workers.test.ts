// A multi-worker server's pure parts (servers/workers, docs/multi-worker.md): which worker owns a
// rollout, how the workers' answers become one participant's, and the one records file joined
// from the workers' parts.
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { PrepareReport, StatusReply } from '../../protocol/control.js';
import { ProtocolError } from '../../protocol/errors.js';
import { joinWorkerRecords, workerPartDir } from '../../servers/control/storage/join.js';
import { participantDir } from '../../servers/control/storage/paths.js';
import { readRecords } from '../../servers/control/storage/reader.js';
import { setWorkerRole } from '../../servers/control/storage/worker-role.js';
import { writeRecords } from '../../servers/control/storage/writer.js';
import { mergeExtras, mergeReports, mergeStatus } from '../../servers/workers/merge.js';
import { ownerOf, partition, rolloutOfRunBody, rolloutOfUrl } from '../../servers/workers/owner.js';

describe('ownerOf', () => {
  it('is the same for every attempt of a rollout and spreads rollouts evenly', () => {
    const counts = [0, 0];
    for (let i = 0; i < 10_000; i++) counts[ownerOf(`task${i}-roll${i % 4}`, 2)]! += 1;
    for (const c of counts) expect(c).toBeGreaterThan(4_700);
    expect(rolloutOfUrl('/ng-rollout/task3-roll1-a2/v1/responses')).toBe('task3-roll1');
    expect(rolloutOfUrl('/ng-rollout/task3-roll1/v1/responses')).toBe('task3-roll1');
    expect(rolloutOfUrl('/v1/responses')).toBeUndefined();
    expect(rolloutOfRunBody(Buffer.from(JSON.stringify({ episode_id: { rollout_id: 'r7', attempt: 1 }, task: {} })))).toBe('r7');
    expect(rolloutOfRunBody(Buffer.from('not json'))).toBeUndefined();
    const parts = partition(['a', 'b', 'c', 'd', 'e'], (x) => x, 3);
    expect(parts.flat().sort()).toEqual(['a', 'b', 'c', 'd', 'e']);
    parts.forEach((p, i) => {
      for (const id of p) expect(ownerOf(id, 3)).toBe(i);
    });
  });
});

const report = (over: Partial<PrepareReport>): PrepareReport => ({ ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [], ...over });

describe('merging the workers answers', () => {
  it('one report: ready only when every worker is, counts added, lists joined', () => {
    const merged = mergeReports([
      report({ ready: false, blockers: ['r2', 'r1'], blocker_count: 2, counts: { sessions: 3 }, restarts: ['x'] }),
      report({ blockers: [], counts: { sessions: 4, at_boundary: 1 }, restarts: ['w', 'x'] }),
    ]);
    expect(merged).toEqual({ ready: false, blockers: ['r1', 'r2'], blocker_count: 2, counts: { sessions: 7, at_boundary: 1 }, restarts: ['w', 'x'] });
  });

  it('extras: lists joined and sorted, numbers added, flags and-ed, maps merged, the rest from the first worker', () => {
    expect(
      mergeExtras([
        { restored_pending: ['b'], retired_sessions: 2, accepting: true, mode: 'exported', capabilities: { supports_continuations: true } },
        { restored_pending: ['a'], retired_sessions: 1, accepting: false, mode: 'exported', capabilities: { supports_continuations: true } },
      ]),
    ).toEqual({ restored_pending: ['a', 'b'], retired_sessions: 3, accepting: false, mode: 'exported', capabilities: { supports_continuations: true } });
    // Sorted lists merge linearly, unsorted ones are sorted; per-episode maps keep every key.
    expect(
      mergeExtras([
        { staging_keys: ['a', 'c', 'e'], by_episode: { r1: ['k2', 'k1'], r3: ['k3'] }, notes: ['z', 'y', 'y'] },
        { staging_keys: ['b', 'c', 'd'], by_episode: { r2: ['k4'] }, notes: ['x'] },
      ]),
    ).toEqual({ staging_keys: ['a', 'b', 'c', 'd', 'e'], by_episode: { r1: ['k1', 'k2'], r3: ['k3'], r2: ['k4'] }, notes: ['x', 'y', 'z'] });
  });

  it('one status: the most advanced phase with its checkpoint, the front identity, retired marks added', () => {
    const s = (over: Partial<StatusReply>): StatusReply => ({
      kind: 'agent',
      instance: 'simple_agent',
      phase: 'idle',
      checkpoint_id: null,
      lease_expires_at: null,
      retired_rollouts: 1,
      report: report({}),
      instance_id: 'worker',
      ...over,
    });
    const merged = mergeStatus([s({}), s({ phase: 'prepared', checkpoint_id: 'ck', lease_expires_at: 50 })], 'front');
    expect(merged).toMatchObject({ phase: 'prepared', checkpoint_id: 'ck', lease_expires_at: 50, retired_rollouts: 2, instance_id: 'front', workers: 2 });
  });
});

describe('joinWorkerRecords', () => {
  let root: string;
  beforeEach(() => {
    root = mkdtempSync(path.join(os.tmpdir(), 'join-test-'));
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const KIND = 'agent';
  const NAME = 'simple_agent';
  const rec = (id: string) => ({ episode_id: { rollout_id: id, attempt: 0 }, session: { n: id } });

  async function parts(records: Array<Array<ReturnType<typeof rec>>>) {
    const participant = participantDir(root, KIND, NAME);
    return Promise.all(
      records.map(async (rs, i) => {
        const checkpointDir = workerPartDir(participant, i);
        const manifest = await writeRecords({ checkpointDir, kind: KIND, instance: NAME, checkpointId: 'ck', records: rs });
        return { dir: participantDir(checkpointDir, KIND, NAME), manifest };
      }),
    );
  }

  it("joins the parts into the participant's one file, read back like a single process's; a second join is idempotent", async () => {
    const p = await parts([[rec('a'), rec('b')], [], [rec('c')]]);
    const manifest = await joinWorkerRecords({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck', parts: p });
    expect(manifest.record_count).toBe(3);
    const dir = participantDir(root, KIND, NAME);
    expect(
      readdirSync(dir)
        .filter((f) => !f.startsWith('.'))
        .sort(),
    ).toEqual([manifest.records_file, 'manifest.json'].sort());
    expect(readFileSync(path.join(dir, manifest.records_file), 'utf8').trim().split('\n')).toHaveLength(3);
    const read = await readRecords({ checkpointDir: root, kind: KIND, instance: NAME, scope: null });
    expect(read.records.map((r) => r.episode_id.rollout_id)).toEqual(['a', 'b', 'c']);
    expect(await joinWorkerRecords({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck', parts: p })).toEqual(manifest);
  });

  it('a worker of a server with as many workers reads its own part only, checked against its own digest; any other reader the whole file', async () => {
    const p = await parts([[rec('a'), rec('b')], [], [rec('c')]]);
    const manifest = await joinWorkerRecords({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck', parts: p });
    expect((manifest as { worker_parts?: unknown }).worker_parts).toEqual(
      p.map((x) => ({ bytes: expect.any(Number), records: x.manifest.record_count, sha256: x.manifest.records_sha256 })),
    );
    const ids = async () => (await readRecords({ checkpointDir: root, kind: KIND, instance: NAME, scope: null })).records.map((r) => r.episode_id.rollout_id);
    try {
      setWorkerRole({ index: 0, of: 3 });
      expect(await ids()).toEqual(['a', 'b']);
      setWorkerRole({ index: 1, of: 3 });
      expect(await ids()).toEqual([]);
      setWorkerRole({ index: 2, of: 3 });
      expect(await ids()).toEqual(['c']);
      setWorkerRole({ index: 0, of: 2 }); // another number of workers: the whole file
      expect(await ids()).toEqual(['a', 'b', 'c']);
      // A part whose bytes changed fails that worker's read, naming its part.
      setWorkerRole({ index: 2, of: 3 });
      const file = path.join(participantDir(root, KIND, NAME), manifest.records_file);
      const text = readFileSync(file, 'utf8');
      writeFileSync(file, text.replace('"n":"c"', '"n":"d"'));
      await expect(ids()).rejects.toThrow(/worker 2's part of the records file .* does not match its digest/);
      setWorkerRole({ index: 0, of: 3 });
      expect(await ids()).toEqual(['a', 'b']);
    } finally {
      setWorkerRole(undefined);
    }
  });

  it('refuses a part that does not match its manifest, and a join stopped by a resume publishes nothing', async () => {
    const p = await parts([[rec('a')]]);
    const bad = [{ ...p[0]!, manifest: { ...p[0]!.manifest, records_sha256: '0'.repeat(64) } }];
    await expect(joinWorkerRecords({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck', parts: bad })).rejects.toThrow(ProtocolError);
    // The first part becomes the file by a rename: a failed join puts it back for a retry.
    expect(readFileSync(path.join(p[0]!.dir, p[0]!.manifest.records_file), 'utf8')).toContain('"a"');
    await expect(joinWorkerRecords({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck', parts: p, stopped: () => true })).rejects.toThrow(
      /resumed/,
    );
    expect(readdirSync(participantDir(root, KIND, NAME)).filter((f) => !f.startsWith('.'))).toEqual([]);
  });
});
