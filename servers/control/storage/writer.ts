// The commit write (§9.5): records streamed once into a hidden temp file (records-sink.ts), then
// the file fsynced and renamed to its digest name, the directories fsynced, the manifest published
// last. Every failure is a typed `invalid_checkpoint_state` (§9.7); the temp file never outlives a call.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { refuse } from '../../../protocol/errors.js';
import { toPlainJson } from '../../../protocol/lossless-json.js';
import { SCHEMA_VERSION, recordsFileName, type Manifest } from '../../../protocol/manifest.js';
import { Mutex } from '../../common/async.js';
import { fsyncPath } from '../../common/durable-files.js';
import { manifestExtras, publishManifest } from './manifest.js';
import { participantDir, storageError, tempPath } from './paths.js';
import { dropHeldPart, holdPart, MemoryRecordsTarget } from './held-part.js';
import { RecordsSink } from './records-sink.js';
import { workerRole } from './worker-role.js';

export interface RecordsWriteOptions {
  checkpointDir: string;
  kind: string;
  instance: string;
  checkpointId: string;
  /** Streamed once, in order; each record is serialized and written as it comes. */
  records: Iterable<object> | AsyncIterable<object>;
  /** Kind-specific manifest fields (e.g. `session_owners`); must be plain JSON. */
  extras?: Record<string, unknown>;
}

export interface RecordsWrite {
  /** The published (or identical, already published) manifest; rejects with `invalid_checkpoint_state`. */
  done: Promise<Manifest>;
  /** Stop the write (resume): once this resolves, no manifest of this write will ever appear, unless already published. */
  stop(): Promise<void>;
}

const STOPPED = 'the checkpoint was resumed before its write finished';

/** Starts a commit write in the background. */
export function startRecordsWrite(opts: RecordsWriteOptions): RecordsWrite {
  const lock = new Mutex();
  const flag = { stopped: false };
  // A worker of a multi-worker server writes no file of its own: its part waits in memory for the
  // front's join (held-part.ts), and goes when its checkpoint is resumed.
  const part = workerRole() !== undefined;
  const done = part ? runPartWrite(opts, lock, flag) : runWrite(opts, lock, flag);
  done.catch(() => {}); // the caller may only ever call stop(); never an unhandled rejection
  const stop = (): Promise<void> =>
    lock.run(() => {
      flag.stopped = true;
      if (part) dropHeldPart(opts.checkpointId);
    });
  return { done, stop };
}

export function writeRecords(opts: RecordsWriteOptions): Promise<Manifest> {
  return startRecordsWrite(opts).done;
}

async function runWrite(opts: RecordsWriteOptions, lock: Mutex, flag: { stopped: boolean }): Promise<Manifest> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance);
  const where = `${opts.kind}/${opts.instance}`;
  let tmp: string | undefined;
  let sink: RecordsSink | undefined;
  try {
    if (typeof opts.checkpointId !== 'string') throw refuse('invalid_checkpoint_state', 'checkpoint_id is not a string');
    const extras = manifestExtras(opts.extras);
    await fsp.mkdir(dir, { recursive: true });
    tmp = tempPath(dir, 'records.jsonl');
    sink = new RecordsSink(await fsp.open(tmp, 'wx'));
    const { sha256, count } = await streamRecords(sink, opts.records, flag);
    const manifest = await syncedManifest({ ...opts, dir, extras, sha256, count });
    return await lock.run(async () => {
      if (flag.stopped) throw refuse('invalid_checkpoint_state', STOPPED);
      const file = tmp!;
      tmp = undefined;
      return publishRecordsFile({ dir, file, manifest, where, checkpointDir: opts.checkpointDir });
    });
  } catch (err) {
    await sink?.abort();
    if (tmp) await fsp.rm(tmp, { force: true }).catch(() => {});
    throw storageError(err, `writing the records of ${where}`);
  }
}

/**
 * A worker's part: encoded and hashed as a file would be, held in memory. Its "manifest" is never
 * published: it tells the front the part's digest, count and size (`part_bytes`) for the join.
 */
async function runPartWrite(opts: RecordsWriteOptions, lock: Mutex, flag: { stopped: boolean }): Promise<Manifest> {
  const where = `${opts.kind}/${opts.instance}`;
  const target = new MemoryRecordsTarget();
  const sink = new RecordsSink(target, { sync: false });
  try {
    if (typeof opts.checkpointId !== 'string') throw refuse('invalid_checkpoint_state', 'checkpoint_id is not a string');
    const extras = manifestExtras(opts.extras);
    const { sha256, count } = await streamRecords(sink, opts.records, flag);
    return await lock.run(() => {
      if (flag.stopped) throw refuse('invalid_checkpoint_state', STOPPED);
      holdPart({ checkpointId: opts.checkpointId, chunks: target.chunks, bytes: target.bytes, buffers: target.buffers });
      return manifestOf({ ...opts, extras: { ...extras, part_bytes: target.bytes }, sha256, count });
    });
  } catch (err) {
    await sink.abort();
    target.discard();
    throw storageError(err, `writing the records of ${where}`);
  }
}

/** Every record into the sink, in order; its digest and count. */
async function streamRecords(
  sink: RecordsSink,
  records: Iterable<object> | AsyncIterable<object>,
  flag: { stopped: boolean },
): Promise<{ sha256: string; count: number }> {
  const add = (record: object): Promise<void> | undefined => {
    if (flag.stopped) throw refuse('invalid_checkpoint_state', STOPPED);
    return sink.add(record);
  };
  // Sync iterables without an await per record: only a full batch waits.
  if (Symbol.asyncIterator in records) for await (const record of records) await add(record);
  else
    for (const record of records) {
      const wait = add(record);
      if (wait) await wait;
    }
  return sink.finish();
}

/**
 * The manifest of a records file written and fsynced in `dir` (§9.5 steps 4–5): built from its
 * digest and count, every directory from the participant's up to the checkpoint's fsynced so a
 * host crash cannot lose an entry under a published manifest.
 */
export async function syncedManifest(o: {
  dir: string;
  checkpointDir: string;
  kind: string;
  instance: string;
  checkpointId: string;
  extras: Record<string, unknown>;
  sha256: string;
  count: number;
}): Promise<Manifest> {
  const manifest = manifestOf(o);
  const kindDir = path.dirname(o.dir);
  await Promise.all([o.dir, kindDir, path.dirname(kindDir), o.checkpointDir].map(fsyncPath));
  return manifest;
}

/** The manifest of a records file with this digest and count (§9.4). */
function manifestOf(o: { kind: string; instance: string; checkpointId: string; extras: Record<string, unknown>; sha256: string; count: number }): Manifest {
  return {
    ...o.extras,
    schema_version: SCHEMA_VERSION,
    kind: o.kind,
    instance: o.instance,
    checkpoint_id: o.checkpointId,
    records_file: recordsFileName(o.sha256),
    records_sha256: o.sha256,
    record_count: o.count,
  };
}

/**
 * §9.5 step 6–8: the temp `file` gets its digest name, the manifest is published last (or an
 * identical one already there is returned: an idempotent re-commit); another commit's manifest is
 * a refusal, and this writer's records file goes unless it is the published one.
 */
export async function publishRecordsFile(o: { dir: string; file: string; manifest: Manifest; where: string; checkpointDir: string }): Promise<Manifest> {
  const recordsPath = path.join(o.dir, o.manifest.records_file);
  // An identical same-named file may be replaced; a failed rename leaves no temp file behind.
  await fsp.rename(o.file, recordsPath).catch(async (err: unknown) => {
    await fsp.rm(o.file, { force: true }).catch(() => {});
    throw err;
  });
  const published = await publishManifest(o.dir, o.manifest);
  // Ours, or an identical one already there: key order ignored, 1 equals 1.0 (as in Python).
  if (published === o.manifest || isDeepStrictEqual(toPlainJson(published), toPlainJson(o.manifest))) return published as Manifest;
  if (published.records_file !== o.manifest.records_file) await fsp.rm(recordsPath, { force: true });
  throw refuse(
    'invalid_checkpoint_state',
    `${o.where} in ${o.checkpointDir} already holds a different commit (checkpoint ${JSON.stringify(published.checkpoint_id)})`,
  );
}
