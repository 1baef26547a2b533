// A multi-worker server's pure parts (servers/workers, docs/multi-worker.md): which worker owns a
// rollout, how the workers' answers become one participant's, and the one records file joined
// from the workers' parts.
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { PrepareReport, StatusReply } from '../../protocol/control.js';
import { ProtocolError } from '../../protocol/errors.js';
import type { Manifest } from '../../protocol/manifest.js';
import { placeHeldPart } from '../../servers/control/storage/held-part.js';
import { joinWorkerRecords } from '../../servers/control/storage/join.js';
import { participantDir } from '../../servers/control/storage/paths.js';
import { readRecords } from '../../servers/control/storage/reader.js';
import { setWorkerRole } from '../../servers/control/storage/worker-role.js';
import { startRecordsWrite, writeRecords } from '../../servers/control/storage/writer.js';
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

  interface Part {
    manifest: Manifest;
    bytes: Buffer;
  }

  /** Each worker's commit as a worker makes it (its part held in memory), and the bytes it places. */
  async function parts(records: Array<Array<ReturnType<typeof rec>>>): Promise<Part[]> {
    const out: Part[] = [];
    try {
      for (const [i, rs] of records.entries()) {
        setWorkerRole({ index: i, of: records.length });
        const manifest = await writeRecords({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck', records: rs });
        const scratch = path.join(root, `.records.jsonl.${String(i).padStart(16, '0')}`);
        writeFileSync(scratch, '');
        await placeHeldPart('ck', scratch, 0);
        out.push({ manifest, bytes: readFileSync(scratch) });
        rmSync(scratch);
      }
    } finally {
      setWorkerRole(undefined);
    }
    return out;
  }

  function join(p: readonly Part[], more: { stopped?: () => boolean; placed?: (i: number) => Buffer } = {}): Promise<Manifest> {
    return joinWorkerRecords({
      checkpointDir: root,
      kind: KIND,
      instance: NAME,
      checkpointId: 'ck',
      parts: p.map((x) => x.manifest),
      place: async (i, file, offset) => {
        const fh = await open(file, 'r+');
        const bytes = more.placed?.(i) ?? p[i]!.bytes;
        await fh.write(bytes, 0, bytes.length, offset);
        await fh.close();
      },
      stopped: more.stopped,
    });
  }

  const published = () => readdirSync(participantDir(root, KIND, NAME)).filter((f) => !f.startsWith('.'));

  it("joins the parts into the participant's one file, read back like a single process's; a second join is idempotent", async () => {
    const p = await parts([[rec('a'), rec('b')], [], [rec('c')]]);
    // A worker's commit writes nothing of its own into the checkpoint.
    expect(readdirSync(root)).toEqual([]);
    expect(p.map((x) => (x.manifest as { part_bytes?: number }).part_bytes)).toEqual(p.map((x) => x.bytes.length));
    const manifest = await join(p);
    expect(manifest.record_count).toBe(3);
    const dir = participantDir(root, KIND, NAME);
    expect(readdirSync(dir).sort()).toEqual([manifest.records_file, 'manifest.json'].sort());
    expect(readFileSync(path.join(dir, manifest.records_file), 'utf8').trim().split('\n')).toHaveLength(3);
    const read = await readRecords({ checkpointDir: root, kind: KIND, instance: NAME, scope: null });
    expect(read.records.map((r) => r.episode_id.rollout_id)).toEqual(['a', 'b', 'c']);
    expect(await join(p)).toEqual(manifest);
    expect(readdirSync(dir).sort()).toEqual([manifest.records_file, 'manifest.json'].sort());
  });

  it('a worker of a server with as many workers reads its own part only, checked against its own digest; any other reader the whole file', async () => {
    const p = await parts([[rec('a'), rec('b')], [], [rec('c')]]);
    const manifest = await join(p);
    expect((manifest as { worker_parts?: unknown }).worker_parts).toEqual(
      p.map((x) => ({ bytes: x.bytes.length, records: x.manifest.record_count, sha256: x.manifest.records_sha256 })),
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

  it('publishes nothing and leaves no temp file when a placed part is not what its worker hashed, a size is missing, or a resume stopped it', async () => {
    const p = await parts([[rec('a')], [rec('b')]]);
    const torn = p[1]!.bytes.toString().replace('"b"', '"x"');
    await expect(join(p, { placed: (i) => (i === 1 ? Buffer.from(torn) : p[i]!.bytes) })).rejects.toThrow(/worker 1's records part does not match its digest/);
    const unsized = [p[0]!, { ...p[1]!, manifest: { ...p[1]!.manifest, part_bytes: undefined } }];
    await expect(join(unsized)).rejects.toThrow(ProtocolError);
    await expect(join(p, { stopped: () => true })).rejects.toThrow(/resumed/);
    expect(readdirSync(participantDir(root, KIND, NAME))).toEqual([]);
    expect(published()).toEqual([]);
    // The parts are still there for a retried commit's join.
    expect((await join(p)).record_count).toBe(2);
  });

  it("a worker's held part: only its checkpoint's, only into a join's temp file, gone once its checkpoint is resumed", async () => {
    const file = path.join(root, '.records.jsonl.00000000000000aa');
    writeFileSync(file, '');
    try {
      setWorkerRole({ index: 0, of: 2 });
      const write = startRecordsWrite({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck1', records: [rec('a')] });
      const manifest = await write.done;
      await expect(placeHeldPart('ck0', file, 0)).rejects.toThrow(/no records part of checkpoint 'ck0'/);
      await expect(placeHeldPart('ck1', path.join(root, 'records.jsonl'), 0)).rejects.toThrow(/not a join's temporary records file/);
      expect(await placeHeldPart('ck1', file, 0)).toEqual({ bytes: (manifest as { part_bytes?: number }).part_bytes });
      expect(readFileSync(file, 'utf8')).toContain('"a"');
      await write.stop();
      await expect(placeHeldPart('ck1', file, 0)).rejects.toThrow(/no records part of checkpoint 'ck1'/);
    } finally {
      setWorkerRole(undefined);
    }
  });

  it("a part's kept buffers serve the next commit's part, never while a placement still reads them", async () => {
    const file = path.join(root, '.records.jsonl.00000000000000ab');
    const placed = async (checkpointId: string): Promise<string> => {
      writeFileSync(file, '');
      await placeHeldPart(checkpointId, file, 0);
      return readFileSync(file, 'utf8');
    };
    try {
      setWorkerRole({ index: 0, of: 2 });
      const first = startRecordsWrite({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck1', records: [rec('long-episode-a'), rec('b')] });
      await first.done;
      expect(await placed('ck1')).toContain('"long-episode-a"');
      await first.stop();
      // The next part is shorter and reuses the buffers: exactly its own bytes are placed.
      const second = startRecordsWrite({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck2', records: [rec('c')] });
      await second.done;
      const placedSecond = await placed('ck2');
      expect(placedSecond).toContain('"c"');
      expect(placedSecond).not.toContain('long-episode-a');
      // Resumed while its placement runs, then a new part written at once: the placement still places ck2's bytes.
      writeFileSync(file, '');
      const placing = placeHeldPart('ck2', file, 0);
      await second.stop();
      const third = startRecordsWrite({ checkpointDir: root, kind: KIND, instance: NAME, checkpointId: 'ck3', records: [rec('d')] });
      await third.done;
      await placing;
      expect(readFileSync(file, 'utf8')).toBe(placedSecond);
      await third.stop();
    } finally {
      setWorkerRole(undefined);
    }
  });
});
