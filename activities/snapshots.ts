// The snapshot bundle (docs/controller.md "The snapshot bundle", controller.md §3):
//   <checkpoint_dir>/<anchor>/rollout_snapshots/{tmp_,trash_,}snapshot_NNNNNN/
//     gym/<kind>/<instance>/   written by the Gym commit
//     gym_commit.json          the commit's scope and episode lists (the manifest is completed from it)
//     controller/              the controller's ledger cut: one part per rollout shard (and the
//                              shards' scope candidates)
//     manifest.json            written last
// Allocation, writing, validation, atomic publication, retention and selection for restore.
// Every step may run twice (activity retries), so each is idempotent.
import { createHash } from 'node:crypto';
import { createReadStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { z } from 'zod';
import {
  FAILURE_TYPES,
  GYM_COMMIT_FILE,
  type FileDigest,
  type PublishedCounts,
  type SnapshotLocation,
  type SnapshotManifest,
  type SnapshotManifestSlim,
} from '../protocol/controller.js';
import { isProtocolError } from '../protocol/errors.js';
import { CheckpointIdSchema, captureKeyList } from '../protocol/ids.js';
import { LosslessNumber } from '../protocol/lossless-json.js';
import { ManifestSchema } from '../protocol/manifest.js';
import { readRecords } from '../servers/control/storage/reader.js';
import { heartbeating, invariantFailure, storageFailure } from './activity-context.js';
import { sortKeysDeep } from '../protocol/canonical-json.js';
import { fsyncPath, writeFileAtomically, writeFileDurably } from '../servers/common/durable-files.js';
import { readLedgerParts } from './controller-files.js';
import { takeGymCommitFile } from './gym-commit-file.js';
import { readJsonFile } from './json-file.js';
import { TRAINER_FILE } from './trainer.js';

export const SNAPSHOTS_DIR = 'rollout_snapshots';
export const SNAPSHOT_MANIFEST_FILE = 'manifest.json';
export const SNAPSHOT_FORMAT = 'rollout-checkpoint/ts';
/** 2: the episode lists stay in the commit file, which the manifest names with its digest. */
export const SNAPSHOT_SCHEMA_VERSION = 2;

const SNAPSHOT_NAME = /^snapshot_(\d{6,})$/;
const TMP_NAME = /^tmp_snapshot_(\d{6,})$/;
const LEFTOVER_NAME = /^(tmp|trash)_snapshot_/;
const STEP_ANCHOR = /^step_(0|[1-9][0-9]*)$/;
export const BOOTSTRAP_ANCHOR = 'bootstrap';

/** `snapshot_000042` */
export function snapshotName(sequence: number): string {
  return `snapshot_${String(sequence).padStart(6, '0')}`;
}

/** The trainer step an anchor directory stands for (`bootstrap` → 0), or undefined for another name. */
export function anchorStep(anchor: string): number | undefined {
  if (anchor === BOOTSTRAP_ANCHOR) return 0;
  const m = STEP_ANCHOR.exec(anchor);
  if (!m) return undefined;
  const n = Number(m[1]);
  return Number.isSafeInteger(n) ? n : undefined;
}

// --- manifest schema ------------------------------------------------------------------------

const Sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, 'must be a lowercase SHA-256 hex digest');
const Count = z.number().int().min(0);

export const SnapshotManifestSchema = z.strictObject({
  schema_version: z.literal(SNAPSHOT_SCHEMA_VERSION),
  format: z.literal(SNAPSHOT_FORMAT),
  run: z.string().min(1),
  checkpoint_id: CheckpointIdSchema,
  sequence: z.number().int().min(1),
  base_train_step: Count,
  trainer_version: Count,
  dataloader_cursor: Count,
  gym_topology_fingerprint: Sha256Hex,
  gym_checkpoint: z.strictObject({
    restarts: captureKeyList(),
    participants: z.record(
      z.string(),
      z.strictObject({
        kind: z.string(),
        instance: z.string(),
        manifest: ManifestSchema,
        episode_count: Count,
      }),
    ),
    commit_file: z.strictObject({ file: z.literal(GYM_COMMIT_FILE), sha256: Sha256Hex, bytes: Count }),
  }),
  ledger_parts: z.array(z.strictObject({ file: z.string().regex(/^controller\/ledger-\d+\.json$/), sha256: Sha256Hex, bytes: Count })),
  created_at: z.string().min(1),
});

function schemaProblem(error: z.ZodError): string {
  const i = error.issues[0]!;
  return `${i.path.join('.') || '(root)'}: ${i.message}`;
}

// --- fs helpers -----------------------------------------------------------------------------

const isErrno = (err: unknown, code: string): boolean => (err as NodeJS.ErrnoException | null)?.code === code;

async function exists(p: string): Promise<boolean> {
  try {
    await fsp.lstat(p);
    return true;
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return false;
    throw err;
  }
}

/** fsync every regular file and directory under `dir` (and `dir` itself), children first. */
async function fsyncTree(dir: string): Promise<void> {
  for (const e of await fsp.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) await fsyncTree(p);
    else if (e.isFile()) await fsyncPath(p);
  }
  await fsyncPath(dir);
}

async function digestFile(file: string): Promise<{ sha256: string; bytes: number }> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const chunk of createReadStream(file) as AsyncIterable<Buffer>) {
    hash.update(chunk);
    bytes += chunk.length;
  }
  return { sha256: hash.digest('hex'), bytes };
}

/** Runs `fn`; ApplicationFailures pass through, anything else becomes a retryable storage failure. */
async function storage<T>(context: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ApplicationFailure) throw err;
    throw storageFailure(context, err);
  }
}

function requireTmpDir(tmpDir: string, what: string): void {
  if (typeof tmpDir !== 'string' || !TMP_NAME.test(path.basename(tmpDir))) {
    throw invariantFailure(`${what}: ${JSON.stringify(tmpDir)} is not a tmp_snapshot_NNNNNN directory`);
  }
}

async function requireDir(dir: string, what: string): Promise<void> {
  try {
    const st = await fsp.stat(dir);
    if (!st.isDirectory()) throw invariantFailure(`${what}: ${dir} is not a directory`);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) throw invariantFailure(`${what}: ${dir} does not exist`);
    throw err;
  }
}

async function listSequences(root: string, pattern: RegExp): Promise<{ name: string; sequence: number }[]> {
  let names: string[];
  try {
    names = await fsp.readdir(root);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return [];
    throw err;
  }
  const out: { name: string; sequence: number }[] = [];
  for (const name of names) {
    const m = pattern.exec(name);
    if (m) out.push({ name, sequence: Number(m[1]) });
  }
  return out.sort((a, b) => b.sequence - a.sequence);
}

// --- allocate, write --------------------------------------------------------------------------

export interface AllocateSnapshotInput {
  checkpointDir: string;
  /** `bootstrap` or `step_<N>`. */
  anchor: string;
  /** The checkpoint attempt the temp snapshot is for (recorded in it: see below). */
  checkpointId: string;
}

/** In a temp snapshot: the ID of the checkpoint attempt it was allocated for. */
export const ALLOCATION_FILE = 'checkpoint_id';

/**
 * Deletes leftover `tmp_snapshot_*` / `trash_snapshot_*`, picks sequence = largest existing
 * `snapshot_*` + 1, and creates `tmp_snapshot_NNNNNN`, recording in it the checkpoint it is for.
 *
 * Once per checkpoint attempt: the temp snapshot already allocated for the same checkpoint is not
 * a leftover, and is returned as it is. The attempt allocates from a local activity, which runs again
 * when its worker died before the workflow task that ran it completed, and by then the shards may
 * have written their candidates into the temp snapshot (the same task sent them the request): wiping
 * it would lose them, and the attempt would fail on a file its shard had written.
 */
export async function allocateSnapshot(input: AllocateSnapshotInput): Promise<SnapshotLocation> {
  if (anchorStep(input.anchor) === undefined) {
    throw invariantFailure(`anchor ${JSON.stringify(input.anchor)} is neither ${BOOTSTRAP_ANCHOR} nor step_<N>`);
  }
  if (!CheckpointIdSchema.safeParse(input.checkpointId).success) {
    throw invariantFailure(`allocateSnapshot: checkpoint ID ${JSON.stringify(input.checkpointId)} is not a checkpoint ID`);
  }
  const root = path.join(input.checkpointDir, input.anchor, SNAPSHOTS_DIR);
  return storage(`allocating a snapshot under ${root}`, async () => {
    await fsp.mkdir(root, { recursive: true });
    const names = await fsp.readdir(root);
    let last = 0;
    for (const n of names) {
      const m = SNAPSHOT_NAME.exec(n);
      if (m) last = Math.max(last, Number(m[1]));
    }
    const sequence = last + 1;
    const tmpName = `tmp_${snapshotName(sequence)}`;
    const tmpDir = path.join(root, tmpName);
    const location = { root, anchor: input.anchor, sequence, tmpDir, finalDir: path.join(root, snapshotName(sequence)) };
    const ours = names.includes(tmpName) && (await allocatedFor(tmpDir)) === input.checkpointId;
    for (const n of names.filter((n) => LEFTOVER_NAME.test(n) && !(ours && n === tmpName))) {
      await fsp.rm(path.join(root, n), { recursive: true, force: true });
    }
    if (ours) return location;
    await fsp.mkdir(tmpDir);
    // Not fsynced: it matters only to a process that comes after a worker's death (the page cache
    // outlives it); the publication fsyncs the whole temp tree.
    await writeFileAtomically(path.join(tmpDir, ALLOCATION_FILE), `${input.checkpointId}\n`);
    // mkdir -p may have created the anchor and rollout_snapshots entries too.
    for (const d of [root, path.dirname(root), input.checkpointDir]) await fsyncPath(d);
    return location;
  });
}

/** The checkpoint a temp snapshot was allocated for (undefined: none recorded, or unreadable). */
async function allocatedFor(tmpDir: string): Promise<string | undefined> {
  try {
    return (await fsp.readFile(path.join(tmpDir, ALLOCATION_FILE), 'utf8')).trim();
  } catch {
    return undefined;
  }
}

export interface WriteSnapshotManifestInput {
  tmpDir: string;
  manifest: SnapshotManifest;
}

/** Writes `manifest.json` last, with sorted keys; fsyncs the file and the directory. */
export async function writeSnapshotManifest(input: WriteSnapshotManifestInput): Promise<void> {
  requireTmpDir(input.tmpDir, 'writeSnapshotManifest');
  const parsed = SnapshotManifestSchema.safeParse(input.manifest);
  if (!parsed.success) throw invariantFailure(`snapshot manifest to write is invalid at ${schemaProblem(parsed.error)}`);
  const data = Buffer.from(JSON.stringify(sortKeysDeep(input.manifest), null, 1), 'utf8');
  await storage(`writing the snapshot manifest into ${input.tmpDir}`, async () => {
    await requireDir(input.tmpDir, 'writeSnapshotManifest');
    await writeFileDurably(path.join(input.tmpDir, SNAPSHOT_MANIFEST_FILE), data);
  });
}

// --- validate -------------------------------------------------------------------------------

export interface ValidateSnapshotInput {
  dir: string;
  /** The freshly discovered topology's fingerprint; the snapshot must carry the same one. */
  fingerprint?: string;
}

/** JSON equality ignoring key order; lossless numbers compare by value. */
function jsonEqual(a: unknown, b: unknown): boolean {
  if (a instanceof LosslessNumber) a = a.valueOf();
  if (b instanceof LosslessNumber) b = b.valueOf();
  if (typeof a === 'bigint' || typeof b === 'bigint') return String(a) === String(b);
  if (a === b) return true;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => jsonEqual(x, b[i]));
  }
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return false;
  const ea = a instanceof Map ? Object.fromEntries(a) : (a as Record<string, unknown>);
  const eb = b instanceof Map ? Object.fromEntries(b) : (b as Record<string, unknown>);
  const ka = Object.keys(ea);
  if (ka.length !== Object.keys(eb).length) return false;
  return ka.every((k) => Object.hasOwn(eb, k) && jsonEqual(ea[k], eb[k]));
}

async function readSnapshotManifest(dir: string, bad: (what: string) => ApplicationFailure): Promise<SnapshotManifest> {
  const read = await readJsonFile(path.join(dir, SNAPSHOT_MANIFEST_FILE), SnapshotManifestSchema, bad);
  if (!read) throw bad(`no ${SNAPSHOT_MANIFEST_FILE}`);
  // The raw object (not zod's copy): participant manifests keep their extras as written.
  return read.raw as SnapshotManifest;
}

const PARTICIPANT_CONCURRENCY = 4;

/**
 * Checks a snapshot directory (controller.md §3.4): manifest schema and format; name, sequence and
 * anchor lineage; topology fingerprint; ledger digest and size; every Gym participant's manifest
 * equals the recorded one and its records file verifies (digest and line count, streamed).
 * Any problem → non-retryable `invariant_error`.
 */
export async function validateSnapshot(input: ValidateSnapshotInput): Promise<SnapshotManifest> {
  return checkSnapshot(input.dir, input.fingerprint, (bad) => readSnapshotManifest(input.dir, bad));
}

/** `fn` over every item, at most `n` at once; rejects with the first failure. */
async function atMost<T>(n: number, items: readonly T[], fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

/** `validateSnapshot` of a manifest given or read by `manifestOf` (its schema already checked). */
async function checkSnapshot(
  dir: string,
  fingerprint: string | undefined,
  manifestOf: (bad: (what: string) => ApplicationFailure) => Promise<SnapshotManifest>,
): Promise<SnapshotManifest> {
  const bad = (what: string): ApplicationFailure => invariantFailure(`snapshot ${dir} is invalid: ${what}`, { dir, problem: what.slice(0, 300) });
  return heartbeating({ op: 'validateSnapshot', dir }, () =>
    storage(`validating snapshot ${dir}`, async () => {
      const manifest = await manifestOf(bad);

      const m = /^(?:tmp_)?snapshot_(\d{6,})$/.exec(path.basename(dir));
      if (m && Number(m[1]) !== manifest.sequence) throw bad(`sequence ${manifest.sequence} does not match the directory name`);
      if (path.basename(path.dirname(dir)) === SNAPSHOTS_DIR) {
        const step = anchorStep(path.basename(path.dirname(path.dirname(dir))));
        if (step !== undefined && step !== manifest.base_train_step) {
          throw bad(`base_train_step ${manifest.base_train_step} does not match its anchor (step ${step})`);
        }
      }
      if (fingerprint !== undefined && fingerprint !== manifest.gym_topology_fingerprint) {
        throw bad(`Gym topology fingerprint ${manifest.gym_topology_fingerprint} differs from the current topology's ${fingerprint}`);
      }

      const checkFile = async (part: FileDigest): Promise<void> => {
        let got: { sha256: string; bytes: number };
        try {
          got = await digestFile(path.join(dir, part.file));
        } catch (err) {
          if (isErrno(err, 'ENOENT')) throw bad(`no ${part.file}`);
          throw err;
        }
        if (got.bytes !== part.bytes || got.sha256 !== part.sha256) {
          throw bad(`${part.file} does not match the manifest (sha256 ${got.sha256}, ${got.bytes} bytes; manifest ${part.sha256}, ${part.bytes} bytes)`);
        }
      };

      const entries = Object.entries(manifest.gym_checkpoint.participants);
      for (const [name, p] of entries) {
        if (p.manifest.kind !== p.kind || p.manifest.instance !== p.instance)
          throw bad(`participant ${name}: manifest names ${String(p.manifest.kind)}/${String(p.manifest.instance)}, entry ${p.kind}/${p.instance}`);
        if (p.manifest.checkpoint_id !== manifest.checkpoint_id)
          throw bad(`participant ${name} committed checkpoint ${JSON.stringify(p.manifest.checkpoint_id)}, not ${manifest.checkpoint_id}`);
      }
      // Each participant streams its records file (digest and count, nothing kept). The ledger parts
      // and the records files are read side by side, a few of each at a time: one after the other,
      // the opens and reads of a run's many parts added up while admission is closed.
      const checkParticipant = async ([name, p]: (typeof entries)[number]): Promise<void> => {
        let onDisk: Record<string, unknown>;
        try {
          ({ manifest: onDisk } = await readRecords({ checkpointDir: dir, kind: p.kind, instance: p.instance, scope: new Set(), countOnly: true }));
        } catch (err) {
          if (isProtocolError(err)) throw bad(`participant ${name}: ${err.detail}`);
          throw err;
        }
        if (!jsonEqual(onDisk, p.manifest)) throw bad(`participant ${name}: manifest on disk differs from the recorded commit`);
      };
      const files = [...manifest.ledger_parts, manifest.gym_checkpoint.commit_file];
      await Promise.all([atMost(PARTICIPANT_CONCURRENCY, files, checkFile), atMost(PARTICIPANT_CONCURRENCY, entries, checkParticipant)]);
      return manifest;
    }),
  );
}

// --- publish, retention, discard ------------------------------------------------------------------

export interface PublishSnapshotInput {
  location: SnapshotLocation;
}

/**
 * fsync the temp tree, rename `tmp_snapshot_N` → `snapshot_N`, fsync the parent. Idempotent: if
 * an earlier run already renamed it, only the parent fsync is repeated.
 */
export async function publishSnapshot(input: PublishSnapshotInput): Promise<string> {
  const { root, tmpDir, finalDir, sequence } = input.location;
  if (tmpDir !== path.join(root, `tmp_${snapshotName(sequence)}`) || finalDir !== path.join(root, snapshotName(sequence))) {
    throw invariantFailure(`publishSnapshot: location ${JSON.stringify(input.location)} is not a snapshot location`);
  }
  return heartbeating({ op: 'publishSnapshot', finalDir }, () =>
    storage(`publishing ${tmpDir}`, async () => {
      if (!(await exists(tmpDir))) {
        if (await exists(path.join(finalDir, SNAPSHOT_MANIFEST_FILE))) {
          await fsyncPath(root);
          return finalDir;
        }
        throw invariantFailure(`publishSnapshot: neither ${tmpDir} nor a published ${finalDir} exists`);
      }
      if (!(await exists(path.join(tmpDir, SNAPSHOT_MANIFEST_FILE)))) {
        throw invariantFailure(`publishSnapshot: ${tmpDir} has no ${SNAPSHOT_MANIFEST_FILE} (it is written last, before publication)`);
      }
      if (await exists(finalDir)) throw invariantFailure(`publishSnapshot: ${finalDir} already exists next to ${tmpDir}`);
      await fsyncTree(tmpDir);
      await fsp.rename(tmpDir, finalDir);
      await fsyncPath(root);
      return finalDir;
    }),
  );
}

export interface FinalizeSnapshotInput {
  location: SnapshotLocation;
  /** Completed with the digest of the snapshot's commit file (`GYM_COMMIT_FILE`). */
  manifest: SnapshotManifestSlim;
  /** The topology fingerprint the snapshot must carry. */
  fingerprint: string;
}

/**
 * A workflow's slim manifest completed from the commit file the Gym commit wrote into the same
 * directory: the file must name the same participants with as many episodes each, and the
 * manifest names it with its digest (validation checks the digest like a ledger part's).
 */
async function completeManifest(tmpDir: string, slim: SnapshotManifestSlim): Promise<SnapshotManifest> {
  const g = slim.gym_checkpoint;
  const file = path.join(tmpDir, GYM_COMMIT_FILE);
  const taken = await takeGymCommitFile(tmpDir, slim.checkpoint_id, (what) => invariantFailure(`${tmpDir}: ${what}`));
  if (!taken) throw invariantFailure(`${tmpDir} has no ${GYM_COMMIT_FILE} (the Gym commit writes it)`);
  const commit = taken.lists;
  const names = Object.keys(g.participants).sort();
  if (JSON.stringify(names) !== JSON.stringify(Object.keys(commit.participants).sort())) {
    throw invariantFailure(`${file} names participants ${Object.keys(commit.participants).sort().join(',')}, the commit ${names.join(',')}`);
  }
  const participants: SnapshotManifest['gym_checkpoint']['participants'] = {};
  for (const name of names) {
    const p = g.participants[name]!;
    const f = commit.participants[name]!;
    const count = 'episode_count' in p ? p.episode_count : p.episode_ids.length;
    if (f.kind !== p.kind || f.instance !== p.instance || f.episode_ids.length !== count) {
      throw invariantFailure(
        `${file}: participant ${name} is ${f.kind}/${f.instance} with ${f.episode_ids.length} episodes, the commit ${p.kind}/${p.instance} with ${count}`,
      );
    }
    participants[name] = { kind: p.kind, instance: p.instance, manifest: p.manifest, episode_count: count };
  }
  return { ...slim, gym_checkpoint: { restarts: g.restarts, participants, commit_file: taken.digest } };
}

/**
 * Manifest (written last) → validation → atomic publication, in one activity: three round trips
 * less while Gym admission is closed. A retry after the rename finds the snapshot published and
 * returns it (each step is idempotent on its own, and the published directory is the proof).
 */
export async function finalizeSnapshot(input: FinalizeSnapshotInput): Promise<string> {
  const { tmpDir, finalDir } = input.location;
  if (!(await exists(tmpDir)) && (await exists(path.join(finalDir, SNAPSHOT_MANIFEST_FILE)))) {
    return publishSnapshot({ location: input.location });
  }
  const manifest = await storage(`reading ${GYM_COMMIT_FILE} in ${tmpDir}`, () => completeManifest(tmpDir, input.manifest));
  await writeSnapshotManifest({ tmpDir, manifest });
  // The manifest just checked and written, not read back and parsed again: admission is closed.
  await checkSnapshot(tmpDir, input.fingerprint, async () => manifest);
  return publishSnapshot({ location: input.location });
}

export interface PublishedSnapshotInput {
  location: SnapshotLocation;
  checkpointId: string;
}

/**
 * Whether `checkpointId` has published its snapshot at `location` (the manifest in the final
 * directory names it), with its counts; null when it has not. A checkpoint attempt asks after a
 * failure: when its worker died after publishing, before the workflow task that published
 * completed, the next worker runs that task's local activities again, and the ones before
 * publication fail against what is already done (the temp snapshot renamed, Gym resumed the ID).
 */
export async function snapshotPublishedBy(input: PublishedSnapshotInput): Promise<PublishedCounts | null> {
  const dir = input.location.finalDir;
  const bad = (what: string): ApplicationFailure => invariantFailure(`snapshot ${dir} is invalid: ${what}`, { dir, problem: what.slice(0, 300) });
  return storage(`looking for checkpoint ${input.checkpointId}'s snapshot in ${dir}`, async () => {
    const read = await readJsonFile(path.join(dir, SNAPSHOT_MANIFEST_FILE), SnapshotManifestSchema, bad);
    if (read?.data.checkpoint_id !== input.checkpointId) return null;
    const commit = await takeGymCommitFile(dir, input.checkpointId, bad);
    if (!commit) throw bad(`no ${GYM_COMMIT_FILE}`);
    return { scopeCount: commit.lists.scope.length, restartCount: read.data.gym_checkpoint.restarts.length };
  });
}

export interface ApplyRetentionInput {
  /** The run's checkpoint directory: retention spans every anchor in it. */
  checkpointDir: string;
  keepLatestK: number;
}

/**
 * Retention over the whole checkpoint directory (controller.md §3.5): keeps the newest
 * `keepLatestK` snapshots, newest anchor first (`step_<N>` by N, then `bootstrap`) and by sequence
 * within one; bootstrap snapshots go wholesale once a durable `step_<N>` (its trainer checkpoint)
 * exists. The newest snapshot is always kept: it is the one a recovery restores. Each snapshot
 * that goes is renamed to `trash_…`, its parent fsynced, then deleted. Returns the deleted
 * snapshots as `<anchor>/<name>`.
 */
export async function applyRetention(input: ApplyRetentionInput): Promise<string[]> {
  if (!Number.isSafeInteger(input.keepLatestK) || input.keepLatestK < 1) {
    throw invariantFailure(`keepLatestK must be an integer ≥ 1 (got ${String(input.keepLatestK)})`);
  }
  const { checkpointDir } = input;
  return storage(`applying retention in ${checkpointDir}`, async () => {
    const anchors = await listAnchors(checkpointDir);
    const durableStep = await anyExists(anchors.filter((a) => a !== BOOTSTRAP_ANCHOR).map((a) => path.join(checkpointDir, a, TRAINER_FILE)));
    const ranked: { anchor: string; name: string }[] = [];
    for (const anchor of anchors) {
      for (const { name } of await listSequences(path.join(checkpointDir, anchor, SNAPSHOTS_DIR), SNAPSHOT_NAME)) ranked.push({ anchor, name });
    }
    const doomed = ranked.filter((s, i) => i > 0 && (i >= input.keepLatestK || (s.anchor === BOOTSTRAP_ANCHOR && durableStep)));
    for (const anchor of anchors) {
      const root = path.join(checkpointDir, anchor, SNAPSHOTS_DIR);
      const old = doomed.filter((s) => s.anchor === anchor).map((s) => s.name);
      const trash = (await listSequences(root, /^trash_snapshot_(\d{6,})$/)).map((s) => s.name);
      if (old.length === 0 && trash.length === 0) continue;
      for (const name of old) await fsp.rename(path.join(root, name), path.join(root, `trash_${name}`));
      await fsyncPath(root);
      for (const name of [...old.map((n) => `trash_${n}`), ...trash]) await fsp.rm(path.join(root, name), { recursive: true, force: true });
      await fsyncPath(root);
    }
    return doomed.map((s) => `${s.anchor}/${s.name}`);
  });
}

async function anyExists(files: string[]): Promise<boolean> {
  for (const f of files) if (await exists(f)) return true;
  return false;
}

export interface DiscardSnapshotInput {
  tmpDir: string;
}

/** Deletes an unpublished temp snapshot (a failed attempt). Idempotent. */
export async function discardSnapshot(input: DiscardSnapshotInput): Promise<void> {
  requireTmpDir(input.tmpDir, 'discardSnapshot');
  await storage(`discarding ${input.tmpDir}`, async () => {
    if (!(await exists(input.tmpDir))) return;
    await fsp.rm(input.tmpDir, { recursive: true, force: true });
    await fsyncPath(path.dirname(input.tmpDir));
  });
}

// --- read, select -----------------------------------------------------------------------------

export interface ReadLedgerInput {
  /** A snapshot directory. */
  dir: string;
}

/** A snapshot's ledger: its parts merged, with the manifest's cursor (tools and tests; workflows load one shard's slice). */
export async function readLedger(input: ReadLedgerInput): Promise<unknown> {
  return storage(`reading the ledger of ${input.dir}`, async () => {
    const bad = (what: string): ApplicationFailure => invariantFailure(`snapshot ${input.dir}: ${what}`);
    const manifest = await readSnapshotManifest(input.dir, bad);
    const merged = await readLedgerParts(
      input.dir,
      manifest.ledger_parts.map((p) => p.file),
    );
    return { ...merged, run: manifest.run, cursor: manifest.dataloader_cursor };
  });
}

export interface LatestSnapshotInput {
  checkpointDir: string;
  fingerprint?: string;
  /** Only this anchor's snapshots (the selected trainer anchor's lineage, controller.md §3.7). */
  anchor?: string;
}

export interface SkippedSnapshot {
  dir: string;
  reason: string;
}

export interface LatestSnapshot {
  dir: string;
  anchor: string;
  /**
   * The scope and the participants' episode IDs stay on disk (the commit file), as does the
   * ledger: each rollout shard loads its slice (scopeSlice, loadLedgerSlice).
   */
  manifest: SnapshotManifest;
  /** Newer snapshots that did not validate, newest first. */
  skipped: SkippedSnapshot[];
}

/** Anchors newest first: `step_<N>` by N descending, then `bootstrap`. */
async function listAnchors(checkpointDir: string): Promise<string[]> {
  let entries: import('node:fs').Dirent[];
  try {
    entries = await fsp.readdir(checkpointDir, { withFileTypes: true });
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return [];
    throw err;
  }
  const steps: { name: string; step: number }[] = [];
  let bootstrap = false;
  for (const e of entries) {
    if (!e.isDirectory()) continue;
    if (e.name === BOOTSTRAP_ANCHOR) bootstrap = true;
    else {
      const step = anchorStep(e.name);
      if (step !== undefined) steps.push({ name: e.name, step });
    }
  }
  steps.sort((a, b) => b.step - a.step);
  return [...steps.map((s) => s.name), ...(bootstrap ? [BOOTSTRAP_ANCHOR] : [])];
}

/**
 * The newest snapshot that validates, scanning anchors newest first and each anchor's snapshots
 * newest first; invalid ones are skipped and reported. Null when there is no snapshot at all.
 * When snapshots exist but none validates, refuses (non-retryable `invariant_error` naming them):
 * starting fresh would silently drop a checkpoint (controller.md §3.7).
 */
export async function latestSnapshot(input: LatestSnapshotInput): Promise<LatestSnapshot | null> {
  const skipped: SkippedSnapshot[] = [];
  return heartbeating({ op: 'latestSnapshot' }, () =>
    storage(`selecting a snapshot in ${input.checkpointDir}`, async () => {
      const anchors = await listAnchors(input.checkpointDir);
      for (const anchor of input.anchor === undefined ? anchors : anchors.filter((a) => a === input.anchor)) {
        const root = path.join(input.checkpointDir, anchor, SNAPSHOTS_DIR);
        for (const { name } of await listSequences(root, SNAPSHOT_NAME)) {
          const dir = path.join(root, name);
          try {
            const manifest = await validateSnapshot({ dir, ...(input.fingerprint !== undefined ? { fingerprint: input.fingerprint } : {}) });
            return { dir, anchor, manifest, skipped };
          } catch (err) {
            if (err instanceof ApplicationFailure && err.type === FAILURE_TYPES.invariant) {
              skipped.push({ dir, reason: err.message });
              continue;
            }
            throw err;
          }
        }
      }
      if (skipped.length > 0) {
        throw invariantFailure(`no valid snapshot in ${input.checkpointDir}; refusing to start over: ${skipped.map((s) => s.reason).join(' | ')}`, {
          skipped: skipped.slice(0, 10),
        });
      }
      return null;
    }),
  );
}

export function createSnapshotActivities() {
  return {
    allocateSnapshot,
    writeSnapshotManifest,
    validateSnapshot,
    publishSnapshot,
    finalizeSnapshot,
    snapshotPublishedBy,
    applyRetention,
    discardSnapshot,
    latestSnapshot,
    readLedger,
  };
}
