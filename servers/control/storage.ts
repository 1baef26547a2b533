// Manifest-last checkpoint storage (control-plane.md §9): one digest-named records file per
// participant, streamed line by line, then `manifest.json` created once and never replaced.
// Every failure is a typed `invalid_checkpoint_state` (§9.7); temporary files never outlive a call.
import { createHash, randomBytes, type Hash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import { sortKeysDeep } from '../../protocol/canonical-json.js';
import { ProtocolError, refuse } from '../../protocol/errors.js';
import { captureKey, isSafePathComponent, type CaptureKey, type EpisodeId } from '../../protocol/ids.js';
import { JsonLineEncoder, LosslessJsonError, LosslessNumber, jsonTextOfUtf8, parseLossless, stringifyLossless } from '../../protocol/lossless-json.js';
import { MANIFEST_FILE, RECORDS_FILE_PATTERN, SCHEMA_VERSION, recordsFileName, type CheckpointRecord, type Manifest } from '../../protocol/manifest.js';
import { Mutex } from '../common/async.js';
import type { ScanChunk, ScanReply, ScanRequest } from './records-worker.js';
import { DeferredJson } from '../../protocol/deferred-json.js';
import { decodeEpisodeId, isPlainObject } from './record-episode.js';

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
  /**
   * Stop the write (resume): once this resolves, no manifest of this write will ever appear,
   * unless it had already been published (then `done` resolves with it).
   */
  stop(): Promise<void>;
}

export interface ReadRecordsOptions {
  checkpointDir: string;
  kind: string;
  instance: string;
  /** Capture keys to keep; null keeps every record. */
  scope: ReadonlySet<CaptureKey> | null;
  /** Checks one in-scope record before it is kept; a throw fails the read naming the episode. */
  validate?: (record: CheckpointRecord) => unknown;
  /**
   * A top-level field (the large one: a session's state) to hand out unparsed, as `DeferredJson`.
   * Every line is still parsed and checked before the read returns, on a worker thread; only the
   * objects are built later, on first use. Where no worker runs, or the file is smaller than
   * `deferMinBytes`, the read is the eager one.
   */
  defer?: string;
  /** Default: deferMinBytes(); 0 defers every file. */
  deferMinBytes?: number;
  /**
   * Digest and record count only (a snapshot's validation before publication, §3.4): no line is
   * parsed and nothing is kept. A matching digest proves the bytes are the ones the participant
   * wrote, and it checked every record as it wrote it.
   */
  countOnly?: boolean;
}

/**
 * Below this a records file is read on the main thread even when a field may be deferred: parsing
 * a few MB costs less than handing chunks to the workers (a counter's 3,200 sessions: 0.4 MB).
 * `NG_RECORDS_DEFER_MIN_BYTES` overrides it (tests set 0 to send every file through the workers).
 */
export function deferMinBytes(): number {
  const env = process.env.NG_RECORDS_DEFER_MIN_BYTES;
  if (env === undefined || env === '') return 16 * 1024 * 1024;
  const n = Number(env);
  if (!/^\d+$/.test(env.trim()) || !Number.isSafeInteger(n)) {
    throw new Error(`NG_RECORDS_DEFER_MIN_BYTES must be a whole number of bytes (0 or more), got '${env}'`);
  }
  return n;
}

export interface ReadRecordsResult {
  manifest: Manifest;
  /** In-scope records in file order, `episode_id` normalized (a missing attempt becomes 0). */
  records: CheckpointRecord[];
}

/** `<checkpoint_dir>/gym/<kind>/<instance>`; refuses unsafe path components (§9.1). */
export function participantDir(checkpointDir: string, kind: string, instance: string): string {
  if (typeof kind !== 'string' || !isSafePathComponent(kind)) {
    throw refuse('invalid_checkpoint_state', `kind ${JSON.stringify(kind)} is not a safe path component`);
  }
  if (typeof instance !== 'string' || !isSafePathComponent(instance)) {
    throw refuse('invalid_checkpoint_state', `instance ${JSON.stringify(instance)} is not a safe path component`);
  }
  return path.join(checkpointDir, 'gym', kind, instance);
}

// --- write ----------------------------------------------------------------------------------

/** Bytes per batch handed to one write(2); lines are encoded straight into it. */
const BATCH_BYTES = 8 << 20;
/** Batches written concurrently before the producer waits. */
const MAX_INFLIGHT = 3;
/** Start an fdatasync after this many unsynced bytes so the final fsync has little left to do. */
const EARLY_SYNC_BYTES = 64 << 20;

const STOPPED_DETAIL = 'the checkpoint was resumed before its write finished';

/** Starts a commit write in the background (§9.5). */
export function startRecordsWrite(opts: RecordsWriteOptions): RecordsWrite {
  const lock = new Mutex();
  const flag = { stopped: false };
  const done = runWrite(opts, lock, flag);
  done.catch(() => {}); // the caller may only ever call stop(); never an unhandled rejection
  return {
    done,
    stop: () =>
      lock.run(() => {
        flag.stopped = true;
      }),
  };
}

/** `startRecordsWrite` and wait for its manifest. */
export function writeRecords(opts: RecordsWriteOptions): Promise<Manifest> {
  return startRecordsWrite(opts).done;
}

async function runWrite(opts: RecordsWriteOptions, lock: Mutex, flag: { stopped: boolean }): Promise<Manifest> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance);
  const where = `${opts.kind}/${opts.instance}`;
  if (typeof opts.checkpointId !== 'string') throw refuse('invalid_checkpoint_state', 'checkpoint_id is not a string');
  const extras = manifestExtras(opts.extras);
  let tmpPath: string | undefined;
  let sink: RecordsSink | undefined;
  try {
    await fsp.mkdir(dir, { recursive: true });
    tmpPath = path.join(dir, `.records.jsonl.${randomSuffix()}`);
    sink = new RecordsSink(await fsp.open(tmpPath, 'wx'));
    const s = sink;
    const records = opts.records;
    if (Symbol.asyncIterator in records) {
      for await (const record of records) {
        if (flag.stopped) throw refuse('invalid_checkpoint_state', STOPPED_DETAIL);
        const wait = s.add(record);
        if (wait) await wait;
      }
    } else {
      for (const record of records) {
        if (flag.stopped) throw refuse('invalid_checkpoint_state', STOPPED_DETAIL);
        const wait = s.add(record);
        if (wait) await wait;
      }
    }
    const { sha256, count } = await sink.finish();
    sink = undefined;

    const manifest = buildManifest(opts, extras, sha256, count);
    // Latest §9.5 step 5: a host crash must not lose a directory entry under a published manifest.
    const kindDir = path.dirname(dir);
    const gymDir = path.dirname(kindDir);
    await Promise.all([dir, kindDir, gymDir, opts.checkpointDir].map(fsyncDir));

    const tmp = tmpPath;
    return await lock.run(async () => {
      if (flag.stopped) throw refuse('invalid_checkpoint_state', STOPPED_DETAIL);
      const recordsPath = path.join(dir, manifest.records_file);
      await fsp.rename(tmp, recordsPath); // an identical same-named file may be replaced
      tmpPath = undefined;
      const published = await publishManifest(dir, manifest);
      if (published === 'created') return manifest;
      if (manifestsEqual(published, manifest)) return published; // an idempotent re-commit
      if (published.records_file !== manifest.records_file) await fsp.rm(recordsPath, { force: true });
      throw refuse(
        'invalid_checkpoint_state',
        `${where} in ${opts.checkpointDir} already holds a different commit (checkpoint ${JSON.stringify(published.checkpoint_id)})`,
      );
    });
  } catch (err) {
    await sink?.abort();
    if (tmpPath) await fsp.rm(tmpPath, { force: true }).catch(() => {});
    throw storageError(err, `writing the records of ${where}`);
  }
}

/** The episode of a record to write; refuses a record without a valid one (§9.4). */
function recordEpisode(record: object): EpisodeId {
  if (!isPlainObject(record)) throw refuse('invalid_checkpoint_state', 'a record to write is not a plain object');
  const ep = decodeEpisodeId(record.episode_id);
  if (!ep) {
    throw refuse('invalid_checkpoint_state', `a record to write has no valid episode_id (${describeValue(record.episode_id)})`);
  }
  return ep;
}

/** Kind-specific manifest fields, checked before anything is written: plain JSON, no core field. */
function manifestExtras(extras: Record<string, unknown> | undefined): Record<string, unknown> {
  if (!extras) return {};
  for (const key of CORE_FIELDS) {
    if (Object.prototype.hasOwnProperty.call(extras, key)) {
      throw refuse('invalid_checkpoint_state', `manifest extras may not set ${key}`);
    }
  }
  try {
    // Normalized through JSON so the manifest equals what a reader of the published file gets.
    return JSON.parse(JSON.stringify(extras)) as Record<string, unknown>;
  } catch (err) {
    throw refuse('invalid_checkpoint_state', `manifest extras are not JSON: ${(err as Error).message}`);
  }
}

function buildManifest(opts: RecordsWriteOptions, extras: Record<string, unknown>, sha256: string, count: number): Manifest {
  return {
    ...extras,
    schema_version: SCHEMA_VERSION,
    kind: opts.kind,
    instance: opts.instance,
    checkpoint_id: opts.checkpointId,
    records_file: recordsFileName(sha256),
    records_sha256: sha256,
    record_count: count,
  };
}

const CORE_FIELDS = ['schema_version', 'kind', 'instance', 'checkpoint_id', 'records_file', 'records_sha256', 'record_count'];

/** Like the reference: keys sorted at every level, one-space indent, no trailing newline. */
function manifestText(manifest: Manifest): string {
  return JSON.stringify(sortKeysDeep(manifest), null, 1);
}

/**
 * Creates `manifest.json` only if absent (§9.5 step 6): temp file, fsync, hard link (a link
 * never replaces a name, so of two racing writers exactly one publishes). Returns 'created',
 * or the manifest that was already there.
 */
async function publishManifest(dir: string, manifest: Manifest): Promise<'created' | Manifest> {
  const tmp = path.join(dir, `.manifest.json.${randomSuffix()}`);
  const target = path.join(dir, MANIFEST_FILE);
  let created = false;
  try {
    const fh = await fsp.open(tmp, 'wx');
    try {
      await fh.writeFile(manifestText(manifest));
      await fh.sync();
    } finally {
      await fh.close();
    }
    try {
      await fsp.link(tmp, target);
      created = true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  } finally {
    await fsp.rm(tmp, { force: true });
  }
  if (created) {
    await fsyncDir(dir);
    return 'created';
  }
  const existing = await readManifestObject(dir);
  if (!existing) throw refuse('invalid_checkpoint_state', `${target} exists but is not a JSON object`);
  return existing as Manifest;
}

interface Batch {
  buf: Buffer;
  data: Buffer;
  /** Write and hash both hold the buffer; it returns to the pool when both let go. */
  holds: number;
}

/**
 * Encodes records straight into large byte batches (each line encoded once, never held as a JS
 * string) and writes each batch at its file position while the next is encoded. A single batch
 * is hashed inline; from the second on, hashing runs on the hash worker.
 */
class RecordsSink {
  private readonly encoder = new JsonLineEncoder((chunk) => this.emit(chunk), BATCH_BYTES);
  private readonly pool: Buffer[] = [];
  private readonly inflight: Promise<void>[] = [];
  private hasher: Sha256 | undefined;
  /** The first batch, not hashed until we know whether more follow. */
  private held: Batch | undefined;
  private pos = 0;
  private count = 0;
  private emitted = false;
  private unsynced = 0;
  private syncing: Promise<void> | undefined;
  private failure: unknown;
  private closed = false;

  constructor(private readonly fh: FileHandle) {}

  /**
   * Appends one record. Returns a promise after each full batch: it waits for the disk when
   * too many writes are in flight, and always yields to the event loop (control routes stay served).
   */
  add(record: object): Promise<void> | undefined {
    if (this.failure !== undefined) throw this.failure;
    const ep = recordEpisode(record);
    try {
      this.encoder.writeLine(record);
    } catch (err) {
      if (err instanceof LosslessJsonError) {
        throw refuse('invalid_checkpoint_state', `the record of episode ${captureKey(ep)} cannot be serialized: ${err.message}`);
      }
      throw err;
    }
    this.count++;
    if (!this.emitted) return undefined;
    this.emitted = false;
    return this.pause();
  }

  async finish(): Promise<{ sha256: string; count: number }> {
    this.encoder.flush();
    if (!this.hasher) {
      this.hasher = new Sha256(false);
      if (this.held) this.hashBatch(this.held);
      this.held = undefined;
    }
    await Promise.all(this.inflight);
    if (this.syncing) await this.syncing;
    if (this.failure !== undefined) throw this.failure;
    const sha256 = await this.hasher.digest();
    await this.fh.sync();
    this.closed = true;
    await this.fh.close();
    return { sha256, count: this.count };
  }

  /** After a failure: let in-flight work settle, then close the file. */
  async abort(): Promise<void> {
    this.hasher?.drop();
    await Promise.allSettled([...this.inflight, this.syncing]);
    if (!this.closed) {
      this.closed = true;
      await this.fh.close().catch(() => {});
    }
  }

  /** A batch from the encoder: a view valid only now, so copy it for the write and the hash. */
  private emit(chunk: Buffer): void {
    const pooled = chunk.length <= BATCH_BYTES;
    const buf = (pooled && this.pool.pop()) || sharedBuffer(pooled ? BATCH_BYTES : chunk.length);
    chunk.copy(buf);
    const batch: Batch = { buf, data: buf.subarray(0, chunk.length), holds: pooled ? 2 : Infinity };
    const written = writeAll(this.fh, batch.data, this.pos).then(
      () => this.release(batch),
      (err: unknown) => {
        this.failure ??= err;
      },
    );
    this.pos += chunk.length;
    this.inflight.push(written);
    this.emitted = true;
    if (!this.hasher) {
      if (!this.held) {
        this.held = batch;
      } else {
        this.hasher = new Sha256(true); // more than one batch: worth the hash worker
        this.hashBatch(this.held);
        this.held = undefined;
        this.hashBatch(batch);
      }
    } else {
      this.hashBatch(batch);
    }
    this.unsynced += chunk.length;
    if (this.unsynced >= EARLY_SYNC_BYTES && !this.syncing) {
      // Starts disk writeback while we keep encoding (dirty pages otherwise wait for the fsync).
      this.unsynced = 0;
      this.syncing = Promise.all([...this.inflight])
        .then(() => this.fh.datasync())
        .catch((err: unknown) => {
          this.failure ??= err;
        })
        .finally(() => {
          this.syncing = undefined;
        });
    }
  }

  private hashBatch(batch: Batch): void {
    this.hasher!.update(batch.data).then(
      () => this.release(batch),
      (err: unknown) => {
        this.failure ??= err;
      },
    );
  }

  private release(batch: Batch): void {
    if (--batch.holds === 0) this.pool.push(batch.buf);
  }

  private async pause(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve));
    while (this.inflight.length >= MAX_INFLIGHT) await this.inflight.shift();
    if (this.failure !== undefined) throw this.failure;
  }
}

/** Buffers the hash worker can read without a copy. */
function sharedBuffer(bytes: number): Buffer {
  return Buffer.from(new SharedArrayBuffer(bytes));
}

async function writeAll(fh: FileHandle, chunk: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < chunk.length) {
    const { bytesWritten } = await fh.write(chunk, done, chunk.length - done, position + done);
    if (bytesWritten <= 0) throw new Error('write made no progress');
    done += bytesWritten;
  }
}

async function fsyncDir(dir: string): Promise<void> {
  const fh = await fsp.open(dir, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

function randomSuffix(): string {
  return randomBytes(8).toString('hex');
}

// --- read -----------------------------------------------------------------------------------

const READ_BYTES = 8 << 20;
const SHA256_HEX = /^[0-9a-f]{64}$/;

/** Reads, verifies and filters one participant's records (§9.6). Nothing is returned unless all verified. */
export async function readRecords(opts: ReadRecordsOptions): Promise<ReadRecordsResult> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance);
  const where = `${opts.kind}/${opts.instance} in ${opts.checkpointDir}`;
  try {
    const manifest = await readManifest(dir, opts.kind, opts.instance, where);
    const file = path.join(dir, manifest.records_file);
    let fh: FileHandle;
    try {
      fh = await fsp.open(file, 'r');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') throw refuse('invalid_checkpoint_state', `records file ${manifest.records_file} of ${where} is missing`);
      throw err;
    }
    let size: number;
    try {
      size = (await fh.stat()).size;
    } catch (err) {
      await fh.close().catch(() => {});
      throw err;
    }
    const lines = new RecordLines(manifest.records_file, opts.scope, opts.validate, opts.countOnly === true);
    if (opts.defer !== undefined && !opts.countOnly && size >= (opts.deferMinBytes ?? deferMinBytes())) {
      const workers = await RecordsWorkers.get();
      if (workers?.alive) {
        await fh.close().catch(() => {});
        const sha256 = await workers.read(file, size, opts.scope, opts.defer, lines);
        return verified(manifest, sha256, lines, where);
      }
    }
    let hasher: Sha256 | undefined;
    let pending: Promise<Buffer> | undefined;
    try {
      hasher = new Sha256(size > READ_BYTES);
      // Two buffers: one is read into (ahead) while the other is hashed and parsed.
      const bufBytes = Math.max(1, Math.min(READ_BYTES, size));
      const bufs = [sharedBuffer(bufBytes), sharedBuffer(bufBytes)];
      const hashed: Promise<void>[] = [Promise.resolve(), Promise.resolve()];
      let position = 0;
      let i = 0;
      pending = readChunk(fh, bufs[0]!, position);
      for (;;) {
        const chunk = await pending;
        pending = undefined;
        if (chunk.length === 0) break;
        position += chunk.length;
        await hashed[i ^ 1]; // the other buffer's bytes must be hashed before it is read into
        pending = readChunk(fh, bufs[i ^ 1]!, position);
        hashed[i] = hasher.update(chunk);
        hashed[i]!.catch(() => {});
        lines.feed(chunk);
        i ^= 1;
        // Parsing 8 MB takes tens of ms: let control routes in between chunks.
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
      lines.end();
    } catch (err) {
      hasher?.drop();
      throw err;
    } finally {
      if (pending) await pending.catch(() => {});
      await fh.close().catch(() => {});
    }
    return verified(manifest, await hasher.digest(), lines, where);
  } catch (err) {
    throw storageError(err, `reading the records of ${where}`);
  }
}

/** §9.6 step 4: digest and count, then the kept records. */
function verified(manifest: Manifest, sha256: string, lines: RecordLines, where: string): ReadRecordsResult {
  if (sha256 !== manifest.records_sha256) {
    throw refuse('invalid_checkpoint_state', `records file of ${where} does not match its digest (sha256 ${sha256}, manifest ${manifest.records_sha256})`);
  }
  if (lines.count !== manifest.record_count) {
    throw refuse('invalid_checkpoint_state', `records file of ${where} holds ${lines.count} records, manifest says ${manifest.record_count}`);
  }
  return { manifest, records: lines.kept };
}

// --- deferred read: the records worker -------------------------------------------------------

/** Chunks the worker reads and sends (whole lines; grows for a longer line). */
const SCAN_CHUNK_BYTES = 8 << 20;

/**
 * The worker runs TypeScript modules (records-worker.ts and what it imports), so it registers
 * tsx first, as every process of this project runs under it.
 */
const RECORDS_WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
(async () => {
  const { register } = await import(${JSON.stringify(tsxApiSpecifier())});
  register();
  await import(${JSON.stringify(new URL('./records-worker.ts', import.meta.url).href)});
  parentPort.postMessage({ ready: true });
})().catch((err) => parentPort.postMessage({ failed: String((err && err.stack) || err) }));
`;

/** tsx's register API, resolved from here: an eval'd worker resolves bare names from the cwd. */
function tsxApiSpecifier(): string {
  try {
    return import.meta.resolve('tsx/esm/api');
  } catch {
    return 'tsx/esm/api';
  }
}

type ScanHandler = (m: ScanReply) => void;

/** One records worker thread. */
class RecordsWorker {
  readonly handlers = new Map<number, ScanHandler>();
  dead: Error | undefined;

  constructor(readonly worker: Worker) {}

  die(err: Error): void {
    this.dead ??= err;
    for (const [id, h] of this.handlers) h({ id, error: err.message });
    this.handlers.clear();
  }

  scan(req: ScanRequest, onReply: ScanHandler): void {
    if (this.dead) {
      onReply({ id: req.id, error: this.dead.message });
      return;
    }
    this.handlers.set(req.id, (m) => {
      if ('error' in m || 'done' in m) {
        this.handlers.delete(req.id);
        if (this.handlers.size === 0) this.worker.unref();
      }
      onReply(m);
    });
    this.worker.ref();
    this.worker.postMessage(req);
  }
}

/** Records workers: one per core (up to 4), started together on first use, unref'd when idle. */
class RecordsWorkers {
  private static starting: Promise<RecordsWorkers | undefined> | undefined;
  private seq = 0;

  private constructor(private readonly workers: RecordsWorker[]) {}

  static get(): Promise<RecordsWorkers | undefined> {
    RecordsWorkers.starting ??= RecordsWorkers.start();
    return RecordsWorkers.starting;
  }

  private static async start(): Promise<RecordsWorkers | undefined> {
    const n = Math.max(1, Math.min(4, os.availableParallelism()));
    const started = await Promise.all(Array.from({ length: n }, () => startRecordsWorker()));
    const ok = started.filter((w): w is RecordsWorker => w !== undefined);
    if (ok.length < n) {
      process.emitWarning(`records workers did not start (${lastWorkerFailure ?? 'unknown reason'}): restores parse every record on the main thread`);
      for (const w of ok) void w.worker.terminate();
      RecordsWorkers.starting = undefined; // the next read tries again
      return undefined;
    }
    return new RecordsWorkers(ok);
  }

  get alive(): boolean {
    return this.workers.every((w) => !w.dead);
  }

  /**
   * Scans `file` in one range per worker; applies the chunks to `lines` in file order (a later
   * range's chunks wait for the earlier ranges), hashing them on the way; resolves with the digest.
   */
  async read(file: string, size: number, scope: ReadonlySet<CaptureKey> | null, field: string, lines: RecordLines): Promise<string> {
    const bounds = await lineBounds(file, size, size < 2 * SCAN_CHUNK_BYTES ? 1 : this.workers.length);
    const cancel = new SharedArrayBuffer(4);
    const scopeList = scope ? [...scope] : null;
    const hash = createHash('sha256');
    const ranges = bounds.slice(1).map(() => ({ queue: [] as ScanReply[], done: false }));
    let current = 0;
    let base = 0; // lines in the ranges before `current`
    let seen = 0; // lines applied so far
    return new Promise<string>((resolve, reject) => {
      let settled = false;
      const finish = (err: unknown, digest?: string) => {
        if (settled) return;
        settled = true;
        if (err === undefined) resolve(digest!);
        else {
          Atomics.store(new Int32Array(cancel), 0, 1);
          reject(err);
        }
      };
      const apply = (m: ScanReply): boolean => {
        if ('error' in m) {
          finish(Object.assign(new Error(m.error), { code: m.code }));
          return false;
        }
        if ('done' in m) {
          base = seen;
          return true;
        }
        const bytes = Buffer.from(m.bytes, 0, m.length);
        hash.update(bytes);
        takeChunk(bytes, m, base, field, lines);
        seen += m.lines;
        lines.count = seen;
        return true;
      };
      const drain = () => {
        try {
          while (!settled && current < ranges.length) {
            const r = ranges[current]!;
            while (r.queue.length > 0) if (!apply(r.queue.shift()!)) return;
            if (!r.done) return;
            current++;
          }
          if (!settled) finish(undefined, hash.digest('hex'));
        } catch (err) {
          finish(err);
        }
      };
      ranges.forEach((r, i) => {
        const id = ++this.seq;
        const req: ScanRequest = { id, file, start: bounds[i]!, end: bounds[i + 1]!, scope: scopeList, field, chunkBytes: SCAN_CHUNK_BYTES, cancel };
        this.workers[i]!.scan(req, (m) => {
          if ('error' in m || 'done' in m) r.done = true;
          r.queue.push(m);
          if (i === current) drain();
        });
      });
    });
  }
}

let lastWorkerFailure: string | undefined;

function startRecordsWorker(): Promise<RecordsWorker | undefined> {
  return new Promise((resolve) => {
    let worker: Worker;
    try {
      worker = new Worker(RECORDS_WORKER_SOURCE, { eval: true });
    } catch {
      resolve(undefined);
      return;
    }
    const self = new RecordsWorker(worker);
    const fail = (why: string) => {
      lastWorkerFailure = why;
      self.die(new Error(`records worker: ${why}`));
      resolve(undefined);
    };
    worker.on('message', (m: ScanReply | { ready: true } | { failed: string }) => {
      if ('ready' in m) {
        if (self.handlers.size === 0) worker.unref(); // ref'd while starting: an awaited start keeps the process up
        resolve(self);
      } else if ('failed' in m) {
        void worker.terminate();
        fail(m.failed);
      } else self.handlers.get(m.id)?.(m);
    });
    worker.on('error', (err) => fail(err.message));
    worker.on('exit', (code) => fail(`exited with code ${code}`));
  });
}

/** Offsets splitting `file` into `parts` ranges of whole lines: [0, …, size]. */
async function lineBounds(file: string, size: number, parts: number): Promise<number[]> {
  const bounds = [0];
  if (parts > 1) {
    const fh = await fsp.open(file, 'r');
    try {
      const window = Buffer.allocUnsafe(1 << 20);
      for (let k = 1; k < parts; k++) {
        // The first LF at or after the k-th share ends that range (a line longer than the share: fewer ranges).
        let at = Math.max(bounds[bounds.length - 1]!, Math.floor((size * k) / parts));
        let cut = -1;
        while (cut < 0 && at < size) {
          const { bytesRead } = await fh.read(window, 0, window.length, at);
          if (bytesRead === 0) break;
          const nl = window.subarray(0, bytesRead).indexOf(10);
          if (nl >= 0) cut = at + nl + 1;
          else at += bytesRead;
        }
        if (cut < 0 || cut >= size) break;
        if (cut > bounds[bounds.length - 1]!) bounds.push(cut);
      }
    } finally {
      await fh.close();
    }
  }
  bounds.push(size);
  return bounds;
}

/** Applies one scanned chunk: worker-proved lines become records with a deferred field; the rest are parsed here. */
function takeChunk(bytes: Buffer, chunk: ScanChunk, base: number, field: string, lines: RecordLines): void {
  const noted = chunk.noted;
  let keptBytes = 0;
  for (let i = 0; i < noted.length; i += 4) if (noted[i + 3]! >= 0) keptBytes += noted[i + 2]! - noted[i + 1]!;
  // Views keep the whole chunk alive: copy the lines out when they are the smaller part of it.
  const copy = keptBytes * 2 < bytes.length;
  for (let i = 0; i < noted.length; i += 4) {
    const n = base + noted[i]!;
    const line = bytes.subarray(noted[i + 1]!, noted[i + 2]!);
    const env = noted[i + 3]!;
    if (env < 0) {
      lines.takeLine(n, line);
      continue;
    }
    const record = JSON.parse(chunk.envelopes[env]!) as CheckpointRecord;
    const ep = decodeEpisodeId(record.episode_id)!; // the worker checked it
    record.episode_id = ep;
    (record as Record<string, unknown>)[field] = new DeferredJson(copy ? Buffer.from(line) : line, field);
    lines.count = n;
    lines.keep(record, captureKey(ep));
  }
}

function readChunk(fh: FileHandle, buf: Buffer, position: number): Promise<Buffer> {
  const p = fh.read(buf, 0, buf.length, position).then(({ bytesRead }) => buf.subarray(0, bytesRead));
  p.catch(() => {}); // awaited later; a failure must not count as unhandled meanwhile
  return p;
}

/** Splits chunks on LF and turns each line into a kept (or discarded) record. */
class RecordLines {
  count = 0;
  readonly kept: CheckpointRecord[] = [];
  private partial: Buffer[] = [];

  /** Count only: whether the bytes so far end inside a line (one without its LF yet). */
  private inLine = false;

  constructor(
    private readonly file: string,
    private readonly scope: ReadonlySet<CaptureKey> | null,
    private readonly validate: ((record: CheckpointRecord) => unknown) | undefined,
    private readonly countOnly = false,
  ) {}

  feed(chunk: Buffer): void {
    if (this.countOnly) {
      for (let nl = chunk.indexOf(10); nl >= 0; nl = chunk.indexOf(10, nl + 1)) this.count += 1;
      if (chunk.length > 0) this.inLine = chunk[chunk.length - 1] !== 10;
      return;
    }
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl < 0) break;
      if (this.partial.length > 0) {
        this.partial.push(chunk.subarray(start, nl));
        const line = Buffer.concat(this.partial);
        this.partial = [];
        this.lineBytes(line);
      } else {
        this.lineBytes(chunk.subarray(start, nl));
      }
      start = nl + 1;
    }
    // Copied: the chunk's buffer is read into again while this line is still incomplete.
    if (start < chunk.length) this.partial.push(Buffer.from(chunk.subarray(start)));
  }

  /** A last line without LF still counts (as the reference's line iteration does). */
  end(): void {
    if (this.countOnly) {
      if (this.inLine) this.count += 1;
      this.inLine = false;
      return;
    }
    if (this.partial.length === 0) return;
    const line = Buffer.concat(this.partial);
    this.partial = [];
    this.lineBytes(line);
  }

  private lineBytes(bytes: Buffer): void {
    let text: string;
    try {
      text = jsonTextOfUtf8(bytes);
    } catch (err) {
      throw refuse('invalid_checkpoint_state', `line ${this.count + 1} of ${this.file} is not JSON: ${(err as Error).message}`);
    }
    this.lineText(text);
  }

  private lineText(text: string): void {
    const n = ++this.count;
    let value: unknown;
    try {
      value = parseLossless(text);
    } catch (err) {
      throw refuse('invalid_checkpoint_state', `line ${n} of ${this.file} is not JSON: ${(err as Error).message}`);
    }
    const ep = isPlainObject(value) ? decodeEpisodeId(value.episode_id) : undefined;
    if (!ep) throw refuse('invalid_checkpoint_state', `line ${n} of ${this.file} has no valid episode_id`);
    const key = captureKey(ep);
    if (this.scope && !this.scope.has(key)) return;
    const record = value as CheckpointRecord;
    record.episode_id = ep;
    this.keep(record, key);
  }

  /** Line `n` as the deferred reader's worker left it to us: parsed here, errors named here. */
  takeLine(n: number, bytes: Buffer): void {
    this.count = n - 1;
    this.lineBytes(bytes);
  }

  /** An in-scope record: validated, then kept. */
  keep(record: CheckpointRecord, key: CaptureKey): void {
    if (this.validate) {
      try {
        this.validate(record);
      } catch (err) {
        const why = err instanceof ProtocolError ? err.detail : (err as Error)?.message ?? String(err);
        throw refuse('invalid_checkpoint_state', `the record of episode ${key} is invalid: ${why}`);
      }
    }
    this.kept.push(record);
  }
}

async function readManifest(dir: string, kind: string, instance: string, where: string): Promise<Manifest> {
  const m = await readManifestObject(dir);
  const bad = (what: string) => refuse('invalid_checkpoint_state', `manifest of ${where}: ${what}`);
  if (m === undefined) throw refuse('invalid_checkpoint_state', `no ${MANIFEST_FILE} for ${where}`);
  if (m === null) throw bad('not a JSON object');
  const version = m.schema_version;
  if (!(version === SCHEMA_VERSION || (version instanceof LosslessNumber && version.valueOf() === SCHEMA_VERSION))) {
    throw bad(`unsupported schema_version ${describeValue(version)}`);
  }
  if (m.kind !== kind) throw bad(`kind ${describeValue(m.kind)} is not ${JSON.stringify(kind)}`);
  if (m.instance !== instance) throw bad(`instance ${describeValue(m.instance)} is not ${JSON.stringify(instance)}`);
  if (typeof m.checkpoint_id !== 'string') throw bad('checkpoint_id is not a string');
  if (typeof m.records_file !== 'string') throw bad('records_file is missing or not a string');
  if (!RECORDS_FILE_PATTERN.test(m.records_file)) throw bad(`records_file ${JSON.stringify(m.records_file)} is not a records file name`);
  if (typeof m.records_sha256 !== 'string' || !SHA256_HEX.test(m.records_sha256)) throw bad('records_sha256 is not a lowercase SHA-256 hex digest');
  const count = m.record_count;
  if (typeof count !== 'number' || !Number.isSafeInteger(count) || count < 0) throw bad('record_count is not a non-negative integer');
  return { ...m, schema_version: SCHEMA_VERSION } as Manifest;
}

/**
 * The parsed `manifest.json` of a participant dir: undefined when absent, null when present but
 * not a JSON object. Parsed losslessly (a Python writer may put anything JSON in extras).
 */
async function readManifestObject(dir: string): Promise<Record<string, unknown> | null | undefined> {
  let text: string;
  try {
    text = await fsp.readFile(path.join(dir, MANIFEST_FILE), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  let value: unknown;
  try {
    value = parseLossless(text);
  } catch (err) {
    throw refuse('invalid_checkpoint_state', `${path.join(dir, MANIFEST_FILE)} is not JSON: ${(err as Error).message}`);
  }
  return isPlainObject(value) ? value : null;
}

// --- SHA-256 off the main thread ----------------------------------------------------------------

// Hashing 350 MB costs ~0.2 s of main-thread time (SHA-NI); a worker does it while the main
// thread encodes or parses. Buffers are SharedArrayBuffer-backed, so nothing is copied.
const HASH_WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const streams = new Map();
parentPort.on('message', (m) => {
  try {
    if (m.op === 'drop') { streams.delete(m.id); return; }
    let h = streams.get(m.id);
    if (!h) { h = createHash('sha256'); streams.set(m.id, h); }
    if (m.op === 'update') { h.update(m.data); parentPort.postMessage({ seq: m.seq }); return; }
    streams.delete(m.id);
    parentPort.postMessage({ seq: m.seq, digest: h.digest('hex') });
  } catch (err) {
    parentPort.postMessage({ seq: m.seq, error: String((err && err.message) || err) });
  }
});
`;

interface HashReply {
  seq: number;
  digest?: string;
  error?: string;
}

/** One process-wide worker, started on first use, kept alive (ref'd) only while it owes replies. */
class HashWorker {
  private static instance: HashWorker | undefined | null;
  private readonly worker: Worker;
  private readonly waiting = new Map<number, { resolve: (r: HashReply) => void; reject: (e: Error) => void }>();
  private seq = 0;
  private nextStream = 0;
  private dead: Error | undefined;

  static get(): HashWorker | undefined {
    if (HashWorker.instance === undefined) {
      try {
        HashWorker.instance = new HashWorker();
      } catch {
        HashWorker.instance = null; // no worker threads here: hash inline
      }
    }
    return HashWorker.instance ?? undefined;
  }

  private constructor() {
    this.worker = new Worker(HASH_WORKER_SOURCE, { eval: true });
    this.worker.unref();
    this.worker.on('message', (r: HashReply) => {
      const w = this.waiting.get(r.seq);
      if (!w) return;
      this.waiting.delete(r.seq);
      if (this.waiting.size === 0) this.worker.unref();
      if (r.error !== undefined) w.reject(new Error(`hash worker: ${r.error}`));
      else w.resolve(r);
    });
    const die = (err: Error) => {
      this.dead ??= err;
      if (HashWorker.instance === this) HashWorker.instance = undefined; // the next stream starts a new one
      for (const w of this.waiting.values()) w.reject(err);
      this.waiting.clear();
    };
    this.worker.on('error', die);
    this.worker.on('exit', (code) => die(new Error(`hash worker exited with code ${code}`)));
  }

  stream(): number {
    return ++this.nextStream;
  }

  request(msg: { op: 'update' | 'digest'; id: number; data?: Uint8Array }): Promise<HashReply> {
    const seq = ++this.seq;
    if (this.dead) return Promise.reject(this.dead);
    return new Promise<HashReply>((resolve, reject) => {
      if (this.waiting.size === 0) this.worker.ref();
      this.waiting.set(seq, { resolve, reject });
      this.worker.postMessage({ ...msg, seq });
    });
  }

  drop(id: number): void {
    if (!this.dead) this.worker.postMessage({ op: 'drop', id });
  }
}

/** A running SHA-256, inline or on the hash worker; updates are hashed in call order. */
class Sha256 {
  private readonly inline: Hash | undefined;
  private readonly worker: HashWorker | undefined;
  private readonly id: number;

  constructor(offload: boolean) {
    this.worker = offload ? HashWorker.get() : undefined;
    this.id = this.worker ? this.worker.stream() : 0;
    this.inline = this.worker ? undefined : createHash('sha256');
  }

  /** Resolves once `data` is hashed (its buffer may then be reused). */
  async update(data: Buffer): Promise<void> {
    if (this.inline) {
      this.inline.update(data);
      return;
    }
    await this.worker!.request({ op: 'update', id: this.id, data });
  }

  async digest(): Promise<string> {
    if (this.inline) return this.inline.digest('hex');
    return (await this.worker!.request({ op: 'digest', id: this.id })).digest!;
  }

  /** Frees an abandoned stream's state in the worker. */
  drop(): void {
    this.worker?.drop(this.id);
  }
}

// --- helpers --------------------------------------------------------------------------------

/** A short rendering of a bad field for an error detail. */
function describeValue(v: unknown): string {
  if (v === undefined) return '(missing)';
  let text: string;
  try {
    text = stringifyLossless(v);
  } catch {
    text = String(v);
  }
  return text.length > 120 ? `${text.slice(0, 120)}…` : text;
}

/** Whole-object equality of two parsed manifests (key order ignored; 1 equals 1.0, as in Python). */
function manifestsEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  const na = numeric(a);
  const nb = numeric(b);
  if (na !== undefined || nb !== undefined) {
    if (na === undefined || nb === undefined) return false;
    if (typeof na === 'bigint' || typeof nb === 'bigint') return String(na) === String(nb);
    return na === nb || (na !== na && nb !== nb);
  }
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => manifestsEqual(x, b[i]));
  }
  const ea = entriesOf(a);
  const eb = entriesOf(b);
  if (!ea || !eb || ea.size !== eb.size) return false;
  for (const [k, v] of ea) {
    if (!eb.has(k) || !manifestsEqual(v, eb.get(k))) return false;
  }
  return true;
}

function numeric(v: unknown): number | bigint | undefined {
  if (typeof v === 'number' || typeof v === 'bigint') return v;
  if (v instanceof LosslessNumber) return v.valueOf();
  return undefined;
}

function entriesOf(v: unknown): Map<string, unknown> | undefined {
  if (v instanceof Map) return v as Map<string, unknown>;
  if (isPlainObject(v)) return new Map(Object.entries(v));
  return undefined;
}

/** Any failure of a storage call as `invalid_checkpoint_state` (§9.7), never an untyped error. */
function storageError(err: unknown, context: string): ProtocolError {
  if (err instanceof ProtocolError) return err;
  const e = err as NodeJS.ErrnoException;
  const what = e?.code ? `${e.code}: ${e.message}` : (e?.message ?? String(err));
  return refuse('invalid_checkpoint_state', `${context}: ${what}`);
}
