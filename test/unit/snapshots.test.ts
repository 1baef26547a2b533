// The snapshot bundle activities (docs/controller.md "The snapshot bundle") on a real temp dir:
// allocation, atomic idempotent publication, retention, validation and restore selection.
import { createHash } from 'node:crypto';
import { existsSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import type { ApplicationFailure } from '@temporalio/common';
import { beforeEach, describe, expect, it } from 'vitest';
import {
  ALLOCATION_FILE,
  allocateSnapshot,
  applyRetention,
  discardSnapshot,
  latestSnapshot,
  finalizeSnapshot,
  publishSnapshot,
  snapshotPublishedBy,
  readLedger,
  validateSnapshot,
  writeSnapshotManifest,
} from '../../activities/snapshots.js';
import { writeLedgerPart } from '../../activities/controller-files.js';
import { topologyFingerprint } from '../../activities/gym.js';
import {
  GYM_COMMIT_FILE,
  type GymCommitFile,
  type GymParticipantCommit,
  type SnapshotLocation,
  type SnapshotManifest,
  type SnapshotManifestSlim,
} from '../../protocol/controller.js';
import { packJson } from '../../protocol/packed-json.js';
import { writeRecords } from '../../servers/control/storage/writer.js';
import { tempDir } from '../helpers/temp-dir.js';
import { failureOf } from '../helpers/activity.js';

let dir: string;
let checkpoints = 0;
/** A checkpoint ID of its own for each allocation (one allocated twice for the same ID is kept). */
const nextCheckpointId = (): string => `ckpt-${++checkpoints}`;

beforeEach(() => {
  dir = tempDir('snapshots-test');
});

const FINGERPRINT = topologyFingerprint([
  { name: 'env', kind: 'environment' },
  { name: 'res', kind: 'resources' },
]);

async function expectFailure(p: Promise<unknown>, type: string, pattern?: RegExp): Promise<ApplicationFailure> {
  const f = await failureOf(p);
  expect(f.type).toBe(type);
  if (pattern) expect(f.message).toMatch(pattern);
  return f;
}

/** What a Gym commit plus the checkpoint attempt would write into a temp snapshot (its commit file too). */
async function writeBundle(loc: SnapshotLocation, opts: { step?: number; ledger?: unknown } = {}): Promise<SnapshotManifest> {
  const checkpointId = `rollout-step-${opts.step ?? 0}-snapshot-${loc.sequence}-${'0'.repeat(32)}`;
  const lists: Record<string, GymParticipantCommit> = {};
  const participants: SnapshotManifest['gym_checkpoint']['participants'] = {};
  for (const [instance, kind, n] of [
    ['env', 'environment', 3],
    ['res', 'resources', 0],
  ] as const) {
    const records = Array.from({ length: n }, (_, i) => ({ episode_id: { rollout_id: `r${i}`, attempt: 0 }, payload: { i } }));
    const manifest = await writeRecords({ checkpointDir: loc.tmpDir, kind, instance, checkpointId, records });
    lists[instance] = { kind, instance, manifest, episode_ids: records.map((r) => r.episode_id.rollout_id) };
    participants[instance] = { kind, instance, manifest, episode_count: n };
  }
  const commitText = JSON.stringify({ checkpoint_id: checkpointId, scope: ['r0', 'r1', 'r2'], participants: lists } satisfies GymCommitFile);
  await fsp.writeFile(path.join(loc.tmpDir, GYM_COMMIT_FILE), commitText);
  const commitFile = { file: GYM_COMMIT_FILE, sha256: createHash('sha256').update(commitText).digest('hex'), bytes: Buffer.byteLength(commitText) };
  const cut = await writeLedgerPart({ dir: loc.tmpDir, shard: 0, ledger: packJson(opts.ledger ?? { cursor: 7, groups: { g1: [1, 2] }, order: ['g1'] }) });
  const manifest: SnapshotManifest = {
    schema_version: 2,
    format: 'rollout-checkpoint/ts',
    run: 'run-1',
    checkpoint_id: checkpointId,
    sequence: loc.sequence,
    base_train_step: opts.step ?? 0,
    trainer_version: opts.step ?? 0,
    dataloader_cursor: 7,
    gym_topology_fingerprint: FINGERPRINT,
    gym_checkpoint: { restarts: [], participants, commit_file: commitFile },
    ledger_parts: [cut],
    created_at: new Date().toISOString(),
  };
  await writeSnapshotManifest({ tmpDir: loc.tmpDir, manifest });
  return manifest;
}

async function publishedSnapshot(anchor: string, step = 0, ledger?: unknown): Promise<string> {
  const loc = await allocateSnapshot({ checkpointDir: dir, anchor, checkpointId: nextCheckpointId() });
  await writeBundle(loc, { step, ledger });
  return publishSnapshot({ location: loc });
}

describe('allocateSnapshot', () => {
  it('starts at 1 and creates the temp directory', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    expect(loc).toEqual({
      root: path.join(dir, 'bootstrap', 'rollout_snapshots'),
      anchor: 'bootstrap',
      sequence: 1,
      tmpDir: path.join(dir, 'bootstrap', 'rollout_snapshots', 'tmp_snapshot_000001'),
      finalDir: path.join(dir, 'bootstrap', 'rollout_snapshots', 'snapshot_000001'),
    });
    expect((await fsp.stat(loc.tmpDir)).isDirectory()).toBe(true);
  });

  it('picks max(snapshot_*) + 1 and deletes leftover tmp_ and trash_ directories', async () => {
    const root = path.join(dir, 'step_3', 'rollout_snapshots');
    for (const n of ['snapshot_000001', 'snapshot_000007', 'tmp_snapshot_000008/gym/x', 'trash_snapshot_000002/sub', 'tmp_snapshot_000009']) {
      await fsp.mkdir(path.join(root, n), { recursive: true });
    }
    await fsp.writeFile(path.join(root, 'tmp_snapshot_000008', 'ledger.json'), '{}');
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'step_3', checkpointId: nextCheckpointId() });
    expect(loc.sequence).toBe(8);
    expect(path.basename(loc.tmpDir)).toBe('tmp_snapshot_000008');
    expect(await fsp.readdir(loc.tmpDir)).toEqual([ALLOCATION_FILE]); // the leftover's content is gone
    expect((await fsp.readdir(root)).sort()).toEqual(['snapshot_000001', 'snapshot_000007', 'tmp_snapshot_000008']);
  });

  it('allocated again for the same checkpoint (its local activity ran twice), keeps what was written into it', async () => {
    const first = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: 'ckpt-a' });
    await fsp.mkdir(path.join(first.tmpDir, 'controller'));
    await fsp.writeFile(path.join(first.tmpDir, 'controller', 'candidates-0.json'), '{"episodes":[]}');
    await fsp.mkdir(path.join(first.root, 'trash_snapshot_000003'));
    const again = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: 'ckpt-a' });
    expect(again).toEqual(first);
    expect(await fsp.readFile(path.join(again.tmpDir, 'controller', 'candidates-0.json'), 'utf8')).toBe('{"episodes":[]}');
    expect((await fsp.readdir(first.root)).sort()).toEqual(['tmp_snapshot_000001']);
    // Another checkpoint's allocation treats it as a leftover.
    const other = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: 'ckpt-b' });
    expect(other.tmpDir).toBe(first.tmpDir);
    expect(await fsp.readdir(other.tmpDir)).toEqual([ALLOCATION_FILE]);
    expect(await fsp.readFile(path.join(other.tmpDir, ALLOCATION_FILE), 'utf8')).toBe('ckpt-b\n');
  });

  it('refuses an anchor that is neither bootstrap nor step_<N>', async () => {
    await expectFailure(allocateSnapshot({ checkpointDir: dir, anchor: '../x', checkpointId: nextCheckpointId() }), 'invariant_error', /anchor/);
    await expectFailure(allocateSnapshot({ checkpointDir: dir, anchor: 'step_01', checkpointId: nextCheckpointId() }), 'invariant_error');
    await expectFailure(allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: '../x' }), 'invariant_error', /checkpoint ID/);
  });
});

describe('writeLedgerPart / writeSnapshotManifest', () => {
  it("returns the digest and size of a shard's ledger part and writes the manifest with sorted keys", async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc, { ledger: { b: 1, a: [2] } });
    const bytes = await fsp.readFile(path.join(loc.tmpDir, 'controller', 'ledger-0.json'));
    expect(manifest.ledger_parts).toEqual([{ file: 'controller/ledger-0.json', bytes: bytes.length, sha256: expect.stringMatching(/^[0-9a-f]{64}$/) }]);
    expect(JSON.parse(bytes.toString('utf8'))).toEqual({ b: 1, a: [2] });
    const text = await fsp.readFile(path.join(loc.tmpDir, 'manifest.json'), 'utf8');
    const keys = Object.keys(JSON.parse(text) as object);
    expect(keys).toEqual([...keys].sort());
    expect(JSON.parse(text)).toEqual(manifest);
    // No temporary files left behind.
    expect((await fsp.readdir(loc.tmpDir)).sort()).toEqual([ALLOCATION_FILE, 'controller', 'gym', 'gym_commit.json', 'manifest.json'].sort());
    expect(await fsp.readdir(path.join(loc.tmpDir, 'controller'))).toEqual(['ledger-0.json']);
  });

  it('takes the ledger packed (as a shard sends it) and writes it as plain JSON', async () => {
    const ledger = { b: 1, a: [2, { x: 'y' }], c: null };
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    await writeLedgerPart({ dir: loc.tmpDir, shard: 3, ledger: packJson(ledger) });
    expect(await fsp.readFile(path.join(loc.tmpDir, 'controller', 'ledger-3.json'), 'utf8')).toBe(JSON.stringify(ledger));
  });

  it('takes the ledger as its JSON bytes (as a shard sends its cut) and writes them as they are, with the same digest as the value', async () => {
    const ledger = { b: 1, a: [2, { x: 'é' }], c: null };
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const fromBytes = await writeLedgerPart({ dir: loc.tmpDir, shard: 1, ledger: new TextEncoder().encode(JSON.stringify(ledger)) });
    const fromValue = await writeLedgerPart({ dir: loc.tmpDir, shard: 2, ledger });
    expect(await fsp.readFile(path.join(loc.tmpDir, 'controller', 'ledger-1.json'), 'utf8')).toBe(JSON.stringify(ledger));
    expect({ ...fromBytes, file: '' }).toEqual({ ...fromValue, file: '' });
  });

  it('refuses a manifest of the wrong shape and a directory that is not a temp snapshot', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    await expectFailure(
      writeSnapshotManifest({ tmpDir: loc.tmpDir, manifest: { ...manifest, sequence: true } as unknown as SnapshotManifest }),
      'invariant_error',
      /sequence/,
    );
    await expectFailure(writeLedgerPart({ dir: path.join(dir, 'elsewhere'), shard: 0, ledger: packJson({}) }), 'invariant_error');
  });

  it('refuses a manifest that does not name its commit file with a digest, naming where', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    const withList = (extra: Record<string, unknown>) =>
      ({ ...manifest, gym_checkpoint: { ...manifest.gym_checkpoint, ...extra } }) as unknown as SnapshotManifest;
    await expectFailure(
      writeSnapshotManifest({ tmpDir: loc.tmpDir, manifest: withList({ commit_file: { ...manifest.gym_checkpoint.commit_file, sha256: 'x' } }) }),
      'invariant_error',
      /commit_file\.sha256/,
    );
    // The episode lists stay in the commit file: a manifest carrying them is not this format.
    await expectFailure(writeSnapshotManifest({ tmpDir: loc.tmpDir, manifest: withList({ scope: ['r0'] }) }), 'invariant_error', /scope/);
    await expectFailure(writeSnapshotManifest({ tmpDir: loc.tmpDir, manifest: withList({ restarts: [7] }) }), 'invariant_error', /restarts\.0/);
  });

  it('finds a commit file that does not match its digest', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    await writeBundle(loc);
    const file = path.join(loc.tmpDir, GYM_COMMIT_FILE);
    const text = await fsp.readFile(file, 'utf8');
    await fsp.writeFile(file, text.replace('"r2"', '"r9"'));
    await expectFailure(validateSnapshot({ dir: loc.tmpDir, fingerprint: FINGERPRINT }), 'invariant_error', /gym_commit\.json does not match the manifest/);
  });
});

describe('publishSnapshot', () => {
  it('renames tmp → final atomically and is idempotent', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    await writeBundle(loc);
    const final = await publishSnapshot({ location: loc });
    expect(final).toBe(loc.finalDir);
    expect(existsSync(loc.tmpDir)).toBe(false);
    expect(existsSync(path.join(loc.finalDir, 'manifest.json'))).toBe(true);
    // An activity retry after the rename: same answer, nothing changes.
    expect(await publishSnapshot({ location: loc })).toBe(loc.finalDir);
    expect(await fsp.readdir(loc.root)).toEqual(['snapshot_000001']);
    await validateSnapshot({ dir: final, fingerprint: FINGERPRINT });
  });

  it('refuses to publish without a manifest, or when neither directory exists', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    await expectFailure(publishSnapshot({ location: loc }), 'invariant_error', /manifest\.json/);
    await discardSnapshot({ tmpDir: loc.tmpDir });
    await expectFailure(publishSnapshot({ location: loc }), 'invariant_error', /neither/);
    await expectFailure(publishSnapshot({ location: { ...loc, finalDir: path.join(dir, 'x') } }), 'invariant_error');
  });
});

describe('snapshotPublishedBy', () => {
  it("answers a published snapshot's counts to its own checkpoint only, and null before publication", async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    const id = manifest.checkpoint_id;
    expect(await snapshotPublishedBy({ location: loc, checkpointId: id })).toBeNull();
    await publishSnapshot({ location: loc });
    expect(await snapshotPublishedBy({ location: loc, checkpointId: id })).toEqual({ scopeCount: 3, restartCount: 0 });
    // Another attempt that drew the same sequence (a failed one before it) published nothing.
    expect(await snapshotPublishedBy({ location: loc, checkpointId: `${id.slice(0, -1)}1` })).toBeNull();
  });
});

describe('applyRetention', () => {
  /** Creates snapshot (and other) directories under `<dir>/<anchor>/rollout_snapshots`. */
  async function layout(anchors: Record<string, string[]>, durable: string[] = []): Promise<void> {
    for (const [anchor, names] of Object.entries(anchors)) {
      for (const n of names) await fsp.mkdir(path.join(dir, anchor, 'rollout_snapshots', n, 'gym'), { recursive: true });
    }
    for (const anchor of durable) await fsp.writeFile(path.join(dir, anchor, 'trainer.json'), '{}');
  }
  const listing = async (anchor: string): Promise<string[]> => (await fsp.readdir(path.join(dir, anchor, 'rollout_snapshots'))).sort();

  it('keeps the newest k of one anchor and deletes the rest through trash_', async () => {
    await layout({ step_1: ['snapshot_000001', 'snapshot_000002', 'snapshot_000003', 'snapshot_000010', 'trash_snapshot_000000', 'tmp_snapshot_000011'] });
    const deleted = await applyRetention({ checkpointDir: dir, keepLatestK: 2 });
    expect(deleted).toEqual(['step_1/snapshot_000002', 'step_1/snapshot_000001']);
    expect(await listing('step_1')).toEqual(['snapshot_000003', 'snapshot_000010', 'tmp_snapshot_000011']);
    expect(await applyRetention({ checkpointDir: dir, keepLatestK: 2 })).toEqual([]);
  });

  it('counts k across anchors, newest anchor first (step_10 after step_9, not by name)', async () => {
    await layout({ step_9: ['snapshot_000001', 'snapshot_000002'], step_10: ['snapshot_000001'], step_2: ['snapshot_000005'] }, [
      'step_2',
      'step_9',
      'step_10',
    ]);
    const deleted = await applyRetention({ checkpointDir: dir, keepLatestK: 2 });
    expect(deleted).toEqual(['step_9/snapshot_000001', 'step_2/snapshot_000005']);
    expect(await listing('step_10')).toEqual(['snapshot_000001']);
    expect(await listing('step_9')).toEqual(['snapshot_000002']);
    expect(await listing('step_2')).toEqual([]);
    // the trainer checkpoints themselves are not retention's business
    expect(existsSync(path.join(dir, 'step_2', 'trainer.json'))).toBe(true);
  });

  it('deletes bootstrap snapshots wholesale once a durable step anchor exists, but never the newest snapshot', async () => {
    await layout({ bootstrap: ['snapshot_000001', 'snapshot_000002'] }, []);
    expect(await applyRetention({ checkpointDir: dir, keepLatestK: 3 })).toEqual([]);
    // The step_1 anchor is durable, its snapshot not published yet: the newest (bootstrap) one stays.
    await fsp.mkdir(path.join(dir, 'step_1'));
    await fsp.writeFile(path.join(dir, 'step_1', 'trainer.json'), '{}');
    expect(await applyRetention({ checkpointDir: dir, keepLatestK: 3 })).toEqual(['bootstrap/snapshot_000001']);
    expect(await listing('bootstrap')).toEqual(['snapshot_000002']);
    await layout({ step_1: ['snapshot_000001'] });
    expect(await applyRetention({ checkpointDir: dir, keepLatestK: 3 })).toEqual(['bootstrap/snapshot_000002']);
    expect(await listing('bootstrap')).toEqual([]);
    expect(await listing('step_1')).toEqual(['snapshot_000001']);
  });

  it('keeps bootstrap snapshots within k while no step anchor is durable (trainer off: snapshots under step_N only)', async () => {
    await layout({ bootstrap: ['snapshot_000001'], step_1: ['snapshot_000001'] });
    expect(await applyRetention({ checkpointDir: dir, keepLatestK: 2 })).toEqual([]);
    expect(await applyRetention({ checkpointDir: dir, keepLatestK: 1 })).toEqual(['bootstrap/snapshot_000001']);
  });

  it('refuses keepLatestK < 1', async () => {
    await expectFailure(applyRetention({ checkpointDir: dir, keepLatestK: 0 }), 'invariant_error', /keepLatestK/);
  });

  it('is a no-op on a missing checkpoint directory', async () => {
    expect(await applyRetention({ checkpointDir: path.join(dir, 'nope'), keepLatestK: 1 })).toEqual([]);
  });
});

describe('discardSnapshot', () => {
  it('deletes the temp snapshot, twice without complaint, and nothing else', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    await writeBundle(loc);
    await discardSnapshot({ tmpDir: loc.tmpDir });
    await discardSnapshot({ tmpDir: loc.tmpDir });
    expect(existsSync(loc.tmpDir)).toBe(false);
    await expectFailure(discardSnapshot({ tmpDir: loc.root }), 'invariant_error');
  });
});

describe('finalizeSnapshot', () => {
  it('writes the manifest, validates and publishes in one call; a retry after the rename returns the snapshot', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    await fsp.rm(path.join(loc.tmpDir, 'manifest.json'));
    expect(await finalizeSnapshot({ location: loc, manifest, fingerprint: FINGERPRINT })).toBe(loc.finalDir);
    expect(await validateSnapshot({ dir: loc.finalDir, fingerprint: FINGERPRINT })).toEqual(manifest);
    expect(await finalizeSnapshot({ location: loc, manifest, fingerprint: FINGERPRINT })).toBe(loc.finalDir);
    expect(await fsp.readdir(loc.root)).toEqual(['snapshot_000001']);
  });

  it('publishes nothing that does not validate', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    await expectFailure(finalizeSnapshot({ location: loc, manifest, fingerprint: 'e'.repeat(64) }), 'invariant_error', /fingerprint/);
    expect(existsSync(loc.finalDir)).toBe(false);
  });

  /** The manifest as a workflow sends it: without the commit file's digest. */
  const slimOf = (manifest: SnapshotManifest): SnapshotManifestSlim => ({
    ...manifest,
    gym_checkpoint: { restarts: manifest.gym_checkpoint.restarts, participants: manifest.gym_checkpoint.participants },
  });
  const commitFileIn = async (tmpDir: string): Promise<GymCommitFile> => JSON.parse(await fsp.readFile(path.join(tmpDir, GYM_COMMIT_FILE), 'utf8'));

  it('completes a slim manifest from the commit file the Gym commit wrote', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    await fsp.rm(path.join(loc.tmpDir, 'manifest.json'));
    expect(await finalizeSnapshot({ location: loc, manifest: slimOf(manifest), fingerprint: FINGERPRINT })).toBe(loc.finalDir);
    expect(await validateSnapshot({ dir: loc.finalDir, fingerprint: FINGERPRINT })).toEqual(manifest);
  });

  it('refuses a slim manifest without its commit file, or with one of another commit', async () => {
    const loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'bootstrap', checkpointId: nextCheckpointId() });
    const manifest = await writeBundle(loc);
    await fsp.rm(path.join(loc.tmpDir, 'manifest.json'));
    const slim = slimOf(manifest);
    const file = path.join(loc.tmpDir, GYM_COMMIT_FILE);
    const written = await commitFileIn(loc.tmpDir);
    await fsp.rm(file);
    await expectFailure(finalizeSnapshot({ location: loc, manifest: slim, fingerprint: FINGERPRINT }), 'invariant_error', /no gym_commit\.json/);
    await fsp.writeFile(file, JSON.stringify({ ...written, checkpoint_id: 'another' }));
    await expectFailure(finalizeSnapshot({ location: loc, manifest: slim, fingerprint: FINGERPRINT }), 'invariant_error', /of checkpoint "another"/);
    const fewer = structuredClone(written);
    fewer.participants = { ...fewer.participants, env: { ...fewer.participants.env!, episode_ids: ['r0'] } };
    await fsp.writeFile(file, JSON.stringify(fewer));
    await expectFailure(
      finalizeSnapshot({ location: loc, manifest: slim, fingerprint: FINGERPRINT }),
      'invariant_error',
      /participant env .* with 1 episodes, the commit .* with 3/,
    );
    await fsp.writeFile(file, '{"checkpoint_id": 1}');
    await expectFailure(finalizeSnapshot({ location: loc, manifest: slim, fingerprint: FINGERPRINT }), 'invariant_error', /is invalid at/);
    expect(existsSync(loc.finalDir)).toBe(false);
  });
});

describe('validateSnapshot', () => {
  let loc: SnapshotLocation;
  let manifest: SnapshotManifest;
  beforeEach(async () => {
    loc = await allocateSnapshot({ checkpointDir: dir, anchor: 'step_4', checkpointId: nextCheckpointId() });
    manifest = await writeBundle(loc, { step: 4 });
  });

  it('accepts a complete snapshot and returns its manifest', async () => {
    expect(await validateSnapshot({ dir: loc.tmpDir, fingerprint: FINGERPRINT })).toEqual(manifest);
    expect(await validateSnapshot({ dir: loc.tmpDir })).toEqual(manifest);
  });

  it('catches a tampered ledger part', async () => {
    const file = path.join(loc.tmpDir, 'controller', 'ledger-0.json');
    const text = await fsp.readFile(file, 'utf8');
    await fsp.writeFile(file, text.replace('7', '8')); // same size, other bytes
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /ledger-0\.json does not match/);
    await fsp.rm(file);
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /no controller\/ledger-0\.json/);
  });

  it('catches a missing participant manifest', async () => {
    await fsp.rm(path.join(loc.tmpDir, 'gym', 'resources', 'res', 'manifest.json'));
    const f = await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /participant res/);
    expect(f.nonRetryable).toBe(true);
  });

  it('catches a records digest mismatch', async () => {
    const pdir = path.join(loc.tmpDir, 'gym', 'environment', 'env');
    const records = (await fsp.readdir(pdir)).find((n) => n.startsWith('records-'))!;
    await fsp.appendFile(path.join(pdir, records), '{"episode_id": {"rollout_id": "rX", "attempt": 0}}\n');
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /does not match its digest/);
  });

  it('catches a participant manifest that differs from the recorded commit', async () => {
    const file = path.join(loc.tmpDir, 'gym', 'environment', 'env', 'manifest.json');
    const m = JSON.parse(await fsp.readFile(file, 'utf8')) as Record<string, unknown>;
    await fsp.writeFile(file, JSON.stringify({ ...m, extra: 1 }));
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /differs from the recorded commit/);
  });

  it('catches a wrong topology fingerprint', async () => {
    await expectFailure(validateSnapshot({ dir: loc.tmpDir, fingerprint: 'f'.repeat(64) }), 'invariant_error', /fingerprint/);
  });

  it('catches a manifest of the wrong format or lineage', async () => {
    const file = path.join(loc.tmpDir, 'manifest.json');
    await fsp.writeFile(file, JSON.stringify({ ...manifest, format: 'rollout-checkpoint/py' }));
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /format/);
    await fsp.writeFile(file, JSON.stringify({ ...manifest, base_train_step: 3 }));
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /anchor/);
    await fsp.writeFile(file, '{not json');
    await expectFailure(validateSnapshot({ dir: loc.tmpDir }), 'invariant_error', /not JSON/);
  });
});

describe('latestSnapshot and readLedger', () => {
  it('returns null when there is no snapshot', async () => {
    expect(await latestSnapshot({ checkpointDir: dir })).toBeNull();
    expect(await latestSnapshot({ checkpointDir: path.join(dir, 'missing') })).toBeNull();
  });

  it('takes the newest valid snapshot of the newest anchor, skipping and reporting a corrupt newer one', async () => {
    await publishedSnapshot('bootstrap', 0, { at: 'bootstrap' });
    await publishedSnapshot('step_2', 2, { at: 'step_2' });
    const good = await publishedSnapshot('step_10', 10, { at: 'step_10/1' });
    const corrupt = await publishedSnapshot('step_10', 10, { at: 'step_10/2' });
    await fsp.writeFile(path.join(corrupt, 'controller', 'ledger-0.json'), '{"tampered": true}');
    // Readers ignore tmp_ and trash_ directories.
    await fsp.mkdir(path.join(dir, 'step_10', 'rollout_snapshots', 'tmp_snapshot_000003'));
    await fsp.mkdir(path.join(dir, 'step_10', 'rollout_snapshots', 'trash_snapshot_000009'));

    const found = await latestSnapshot({ checkpointDir: dir, fingerprint: FINGERPRINT });
    expect(found).not.toBeNull();
    expect(found!.dir).toBe(good);
    expect(found!.anchor).toBe('step_10');
    // Without the ledger, the scope and the participants' episode lists: one activity result at any scale.
    expect(found).not.toHaveProperty('ledger');
    expect(found!.manifest.gym_checkpoint).not.toHaveProperty('scope');
    expect(found!.manifest.gym_checkpoint.commit_file.file).toBe(GYM_COMMIT_FILE);
    expect(found!.manifest.ledger_parts.map((p) => p.file)).toEqual(['controller/ledger-0.json']);
    expect(found!.manifest.sequence).toBe(1);
    for (const p of Object.values(found!.manifest.gym_checkpoint.participants)) {
      expect(p).not.toHaveProperty('episode_ids');
      expect(p).toHaveProperty('episode_count');
    }
    expect(found!.skipped).toHaveLength(1);
    expect(found!.skipped[0]!.dir).toBe(corrupt);
    expect(found!.skipped[0]!.reason).toMatch(/ledger-0\.json/);
    expect(await readLedger({ dir: good })).toMatchObject({ run: 'run-1', cursor: 7 });
  });

  it('falls back to an older anchor, then to bootstrap', async () => {
    await publishedSnapshot('bootstrap', 0, { at: 'bootstrap' });
    const bad = await publishedSnapshot('step_1', 1);
    await fsp.rm(path.join(bad, 'manifest.json'));
    const found = await latestSnapshot({ checkpointDir: dir });
    expect(found!.anchor).toBe('bootstrap');
    expect(found!.skipped.map((s) => s.dir)).toEqual([bad]);
  });

  it('refuses when snapshots exist but none validates (wrong topology here)', async () => {
    const only = await publishedSnapshot('step_1', 1);
    const f = await expectFailure(latestSnapshot({ checkpointDir: dir, fingerprint: '0'.repeat(64) }), 'invariant_error', /no valid snapshot/);
    expect(f.message).toContain(only);
  });
});
