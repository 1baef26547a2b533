// The files the rollout shards write and read instead of carrying per-rollout lists through a
// workflow (protocol/controller.ts "the controller's files"): a shard's candidates and ledger part
// in a temp snapshot, its slice of a snapshot's ledger and scope, its part of a restore's scope
// and answer, its part of a step's batch. Each shard writes only its own files; readers filter to
// one shard. Every function may run twice (a replay runs a local activity again): each is
// idempotent.
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import {
  RESTORED_FILE,
  candidatesFile,
  groupOfRollout,
  ledgerPartFile,
  scopePartFile,
  shardOf,
  type CandidatesFile,
  type FileDigest,
} from '../protocol/controller.js';
import { captureKey, parseCaptureKey, type CaptureKey, type EpisodeId } from '../protocol/ids.js';
import { packJson, unpacked, type PackedJson } from '../protocol/packed-json.js';
import { invariantFailure, storageFailure } from './activity-context.js';
import { writeFileAtomically } from '../servers/common/durable-files.js';

async function io<T>(context: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ApplicationFailure) throw err;
    throw storageFailure(context, err);
  }
}

async function readJson(file: string): Promise<unknown> {
  const text = await fsp.readFile(file, 'utf8');
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw invariantFailure(`${file} is not JSON: ${(err as Error).message}`);
  }
}

/** Refuses to write into a directory that is gone (a temp snapshot its attempt discarded). */
async function requireDir(dir: string): Promise<void> {
  try {
    if (!(await fsp.stat(dir)).isDirectory()) throw invariantFailure(`${dir} is not a directory`);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw invariantFailure(`${dir} does not exist (discarded)`);
    throw err;
  }
}

async function writeDigested(dir: string, relative: string, content: string | Uint8Array): Promise<FileDigest> {
  const data = typeof content === 'string' ? Buffer.from(content, 'utf8') : Buffer.from(content.buffer, content.byteOffset, content.byteLength);
  await fsp.mkdir(path.dirname(path.join(dir, relative)), { recursive: true });
  await writeFileAtomically(path.join(dir, relative), data);
  return { file: relative, sha256: createHash('sha256').update(data).digest('hex'), bytes: data.length };
}

export interface WriteCandidatesInput {
  tmpDir: string;
  shard: number;
  episodes: EpisodeId[];
}

/** A shard's scope candidates in a temp snapshot (read by the commit). */
export async function writeCandidates(input: WriteCandidatesInput): Promise<{ count: number }> {
  return io(`writing the candidates of shard ${input.shard} into ${input.tmpDir}`, async () => {
    await requireDir(input.tmpDir);
    const file: CandidatesFile = { shard: input.shard, episodes: input.episodes.map((e) => [e.rollout_id, e.attempt]) };
    await writeDigested(input.tmpDir, candidatesFile(input.shard), JSON.stringify(file));
    return { count: input.episodes.length };
  });
}

/** Every shard's candidates in a temp snapshot, as capture keys. */
export async function readCandidates(tmpDir: string, shards: number): Promise<CaptureKey[]> {
  const out: CaptureKey[] = [];
  for (let k = 0; k < shards; k++) {
    const file = path.join(tmpDir, candidatesFile(k));
    let raw: unknown;
    try {
      raw = await readJson(file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw invariantFailure(`${file} is missing: shard ${k} did not write its candidates`);
      throw err;
    }
    for (const [rollout_id, attempt] of (raw as CandidatesFile).episodes) out.push(captureKey({ rollout_id, attempt }));
  }
  return out;
}

export interface WriteLedgerPartInput {
  /** A temp snapshot, or a trainer anchor's fallback parts directory. */
  dir: string;
  shard: number;
  /**
   * The shard's ledger slice: as it is (a local activity's argument is never stored or sent to
   * the server: packing it in the workflow only cost the shard's workflow task time), packed, or
   * as its JSON text in UTF-8 (written as it is).
   */
  ledger: unknown;
  /** Create `dir` if missing (fallback parts); a temp snapshot must exist. */
  create?: boolean;
}

/** A shard's ledger part (plain JSON), with its digest for the manifest. Not fsynced: see the callers. */
export async function writeLedgerPart(input: WriteLedgerPartInput): Promise<FileDigest> {
  return io(`writing the ledger part of shard ${input.shard} into ${input.dir}`, async () => {
    if (input.create) await fsp.mkdir(input.dir, { recursive: true });
    else await requireDir(input.dir);
    const content = input.ledger instanceof Uint8Array ? input.ledger : JSON.stringify(unpacked(input.ledger));
    return writeDigested(input.dir, ledgerPartFile(input.shard), content);
  });
}

interface LedgerLike {
  schema_version: number;
  run: string;
  cursor: number;
  groups: Record<string, unknown>;
  order: string[];
}

/** The ledger parts of a directory (every `controller/ledger-<k>.json`), merged. */
export async function readLedgerParts(dir: string, files: readonly string[]): Promise<LedgerLike> {
  const out: LedgerLike = { schema_version: 1, run: '', cursor: 0, groups: {}, order: [] };
  for (const f of files) {
    const part = (await readJson(path.join(dir, f))) as LedgerLike;
    out.schema_version = part.schema_version;
    out.run = part.run;
    Object.assign(out.groups, part.groups ?? {});
    out.order.push(...(part.order ?? []));
  }
  return out;
}

export interface LoadLedgerSliceInput {
  /**
   * Where the saved ledger is: a snapshot directory and the parts its manifest lists, or a trainer
   * anchor's Gym-restart fallback marker (which holds the ledger as the anchor was written).
   */
  from: { dir: string; files: string[] } | { marker: string };
  shard: number;
  shards: number;
}

/** The groups a shard owns (under the current shard count) in a saved ledger, packed. */
export async function loadLedgerSlice(input: LoadLedgerSliceInput): Promise<PackedJson> {
  const where = 'marker' in input.from ? input.from.marker : input.from.dir;
  return io(`loading the ledger slice of shard ${input.shard} from ${where}`, async () => {
    const all =
      'marker' in input.from ? ((await readJson(input.from.marker)) as { ledger: LedgerLike }).ledger : await readLedgerParts(input.from.dir, input.from.files);
    const order = all.order.filter((id) => shardOf(id, input.shards) === input.shard);
    const groups: Record<string, unknown> = {};
    for (const id of order) groups[id] = all.groups[id];
    return packJson({ ...all, groups, order });
  });
}

export interface ScopeSliceInput {
  /** A published snapshot: its `gym_commit.json` holds the scope. */
  snapshotDir: string;
  shard: number;
  shards: number;
}

/** The capture keys of a snapshot's scope whose groups a shard owns. */
export async function scopeSlice(input: ScopeSliceInput): Promise<CaptureKey[]> {
  return io(`reading the scope of ${input.snapshotDir}`, async () => {
    const commit = (await readJson(path.join(input.snapshotDir, 'gym_commit.json'))) as { scope: CaptureKey[] };
    return commit.scope.filter((k) => shardOf(groupOfRollout(parseCaptureKey(k)!.rollout_id), input.shards) === input.shard);
  });
}

export interface WriteScopePartInput {
  dir: string;
  shard: number;
  /** `[rollout_id, attempt, environment]` of each saved episode to restore. */
  scope: Array<[string, number, string]>;
}

/** A shard's part of a restore's scope. */
export async function writeScopePart(input: WriteScopePartInput): Promise<{ count: number }> {
  return io(`writing the restore scope of shard ${input.shard} into ${input.dir}`, async () => {
    await fsp.mkdir(input.dir, { recursive: true });
    await writeDigested(input.dir, scopePartFile(input.shard), JSON.stringify({ shard: input.shard, scope: input.scope }));
    return { count: input.scope.length };
  });
}

/** Every shard's part of a restore's scope: the episodes and the environment server of each rollout. */
export async function readScopeParts(dir: string, shards: number): Promise<{ scope: EpisodeId[]; environments: Record<string, string> }> {
  const scope: EpisodeId[] = [];
  const environments: Record<string, string> = {};
  for (let k = 0; k < shards; k++) {
    const part = (await readJson(path.join(dir, scopePartFile(k)))) as { scope: Array<[string, number, string]> };
    for (const [rollout_id, attempt, env] of part.scope) {
      scope.push({ rollout_id, attempt });
      environments[rollout_id] = env;
    }
  }
  return { scope, environments };
}

/** What the restore installed, for the shards to read their part of. */
export async function writeRestored(dir: string, restored: Record<string, CaptureKey[]>): Promise<void> {
  await fsp.mkdir(dir, { recursive: true });
  await writeFileAtomically(path.join(dir, RESTORED_FILE), JSON.stringify({ restored }));
}

export interface RestoredSliceInput {
  dir: string;
  shard: number;
  shards: number;
}

/** The replacements the restore installed for a shard's rollouts (server name → capture keys); none when the restore did not run. */
export async function restoredSlice(input: RestoredSliceInput): Promise<Record<string, CaptureKey[]>> {
  return io(`reading what the restore in ${input.dir} installed`, async () => {
    let raw: unknown;
    try {
      raw = await readJson(path.join(input.dir, RESTORED_FILE));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
      throw err;
    }
    const out: Record<string, CaptureKey[]> = {};
    for (const [server, keys] of Object.entries((raw as { restored: Record<string, CaptureKey[]> }).restored)) {
      out[server] = keys.filter((k) => shardOf(groupOfRollout(parseCaptureKey(k)!.rollout_id), input.shards) === input.shard);
    }
    return out;
  });
}

export interface WriteBatchPartInput {
  file: string;
  /** The shard's groups of a training step (activities/trainer.ts TrainBatch). */
  batch: unknown;
}

/** A shard's part of a step's batch (read by the trainer). Durable: a trainer that lost its state is sent it again. */
export async function writeBatchPart(input: WriteBatchPartInput): Promise<{ file: string }> {
  return io(`writing the batch part ${input.file}`, async () => {
    await fsp.mkdir(path.dirname(input.file), { recursive: true });
    await writeFileAtomically(input.file, JSON.stringify(input.batch));
    return { file: input.file };
  });
}

/** Removes a directory of the controller's files that served its purpose (a recovery's, a trained step's batches). */
export async function removeControllerDir(input: { dir: string }): Promise<void> {
  await io(`removing ${input.dir}`, () => fsp.rm(input.dir, { recursive: true, force: true }));
}

export function createControllerFileActivities() {
  return { writeCandidates, writeLedgerPart, loadLedgerSlice, scopeSlice, writeScopePart, restoredSlice, writeBatchPart, removeControllerDir };
}
