// The restore read (§9.6): manifest, then the records file streamed once in whole-line chunks,
// hashed and parsed (or, with a deferred field, proved good by the scan threads and kept as
// bytes) at once; nothing is returned unless the digest and the record count match the manifest.
import { promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { refuse } from '../../../protocol/errors.js';
import type { CaptureKey } from '../../../protocol/ids.js';
import type { CheckpointRecord, Manifest } from '../../../protocol/manifest.js';
import { RecordsDigest, SHARED_CHUNK_BYTES, returnSharedChunk, sharedBuffer, takeSharedChunk } from './digest.js';
import { readManifest } from './manifest.js';
import { RecordLines, linesIn } from './record-lines.js';
import { participantDir, storageError } from './paths.js';
import { workerRole } from './worker-role.js';
import { SCAN_THREADS, runScan } from './workers.js';

export interface ReadRecordsOptions {
  checkpointDir: string;
  kind: string;
  instance: string;
  /** Capture keys to keep; null keeps every record. */
  scope: ReadonlySet<CaptureKey> | null;
  /** Checks one in-scope record before it is kept; a throw fails the read naming the episode. */
  validate?: (record: CheckpointRecord) => unknown;
  /**
   * A top-level field (the large one: a session's state) to hand out unparsed, as `DeferredJson`:
   * every line is still checked before the read returns, on the scan threads; only the objects are
   * built later, on first use. A file smaller than `deferMinBytes` is read eagerly.
   */
  defer?: string;
  /** Default: deferMinBytes(); 0 defers every file. */
  deferMinBytes?: number;
  /**
   * Digest and record count only (a snapshot's validation before publication, §3.4): no line is
   * parsed. A matching digest proves the bytes are the ones the participant checked as it wrote them.
   */
  countOnly?: boolean;
}

export interface ReadRecordsResult {
  manifest: Manifest;
  /** In-scope records in file order, `episode_id` normalized (a missing attempt becomes 0). */
  records: CheckpointRecord[];
}

/**
 * Below this a records file is parsed on the main thread even when a field may be deferred: a
 * small file costs less to parse than to hand to the threads. `NG_RECORDS_DEFER_MIN_BYTES`
 * overrides it (tests set 0 to send every file through the threads).
 */
export function deferMinBytes(): number {
  const env = process.env.NG_RECORDS_DEFER_MIN_BYTES;
  if (env === undefined || env === '') return 16 * 1024 * 1024;
  if (!/^\d+$/.test(env.trim()) || !Number.isSafeInteger(Number(env))) {
    throw new Error(`NG_RECORDS_DEFER_MIN_BYTES must be a whole number of bytes (0 or more), got '${env}'`);
  }
  return Number(env);
}

const CHUNK_BYTES = SHARED_CHUNK_BYTES;

/**
 * The byte range of this worker's part of a records file joined from as many workers (storage/
 * join.ts), with the part's own digest and count: it holds every episode this worker owns, and the
 * other workers check and parse theirs.
 */
function ownPart(manifest: Manifest, size: number): { start: number; end: number; sha256: string; records: number } | undefined {
  const parts = (manifest as { worker_parts?: unknown }).worker_parts;
  const worker = workerRole();
  if (!worker || !Array.isArray(parts) || parts.length !== worker.of) return undefined;
  let start = 0;
  let own: { start: number; end: number; sha256: string; records: number } | undefined;
  for (const [i, part] of parts.entries()) {
    const { bytes, records, sha256 } = (part ?? {}) as { bytes?: unknown; records?: unknown; sha256?: unknown };
    if (!Number.isSafeInteger(bytes) || !Number.isSafeInteger(records) || typeof sha256 !== 'string') return undefined;
    if (i === worker.index) own = { start, end: start + (bytes as number), sha256, records: records as number };
    start += bytes as number;
  }
  // The parts must tile the file exactly; otherwise the whole file is read.
  return start === size ? own : undefined;
}

export async function readRecords(opts: ReadRecordsOptions): Promise<ReadRecordsResult> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance);
  const where = `${opts.kind}/${opts.instance} in ${opts.checkpointDir}`;
  const digest = new RecordsDigest();
  try {
    const manifest = await readManifest(dir, opts.kind, opts.instance, where);
    const fh = await fsp.open(path.join(dir, manifest.records_file), 'r').catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
      throw refuse('invalid_checkpoint_state', `records file ${manifest.records_file} of ${where} is missing`);
    });
    const lines = new RecordLines(manifest.records_file, opts.scope, opts.validate);
    try {
      const fileSize = (await fh.stat()).size;
      const part = opts.countOnly ? undefined : ownPart(manifest, fileSize);
      const range = part ?? { start: 0, end: fileSize, sha256: manifest.records_sha256, records: manifest.record_count };
      const size = range.end - range.start;
      const field = !opts.countOnly && size >= (opts.deferMinBytes ?? deferMinBytes()) ? opts.defer : undefined;
      const scope = opts.scope ? [...opts.scope] : null;
      // Scanned chunks are applied in file order; a few scans run ahead while the next chunk is read.
      let applied: Promise<void> = Promise.resolve();
      const ahead: Promise<void>[] = [];
      const hashed: Promise<void>[] = [];
      for await (const chunk of wholeLineChunks(fh, range.start, range.end, opts.countOnly ? takeSharedChunk : sharedBuffer)) {
        hashed.push(digest.update(chunk));
        hashed.at(-1)!.catch(() => {}); // awaited after the digest, which releases a held first chunk
        if (opts.countOnly) {
          // A snapshot's validation, once per checkpoint in the controller's worker: nothing keeps
          // a view into a counted chunk once it is hashed, so its memory is kept for the next read.
          lines.count += linesIn(chunk);
          void hashed.at(-1)!.then(
            () => returnSharedChunk(chunk),
            () => {},
          );
          // The previous chunk hashed before the next is read: two in flight at most.
          if (hashed.length > 1) await hashed.at(-2);
        } else if (field === undefined) {
          lines.parseChunk(chunk);
          // Parsing a chunk takes tens of ms: let control routes in between.
          await new Promise<void>((resolve) => setImmediate(resolve));
        } else {
          const scanned = runScan({ chunk, scope, field });
          applied = Promise.all([scanned, applied]).then(([s]) => lines.takeScanned(chunk, s, field));
          applied.catch(() => {}); // awaited below
          ahead.push(applied);
          if (ahead.length > SCAN_THREADS) await ahead.shift();
        }
      }
      await applied;
      const sha256 = await digest.digest();
      await Promise.all(hashed);
      const what = part ? `worker ${workerRole()!.index}'s part of the records file` : 'records file';
      if (sha256 !== range.sha256) {
        throw refuse('invalid_checkpoint_state', `${what} of ${where} does not match its digest (sha256 ${sha256}, manifest ${range.sha256})`);
      }
      if (lines.count !== range.records) {
        throw refuse('invalid_checkpoint_state', `${what} of ${where} holds ${lines.count} records, manifest says ${range.records}`);
      }
      return { manifest, records: lines.kept };
    } finally {
      await fh.close().catch(() => {});
    }
  } catch (err) {
    digest.drop();
    throw storageError(err, `reading the records of ${where}`);
  }
}

/**
 * The file's bytes from `start` to `end` in chunks of whole lines (the last may lack its LF), each
 * in shared memory from `take` (fresh, unless the read keeps nothing): kept records may hold views
 * into it, and the threads read it without a copy. Concatenated, the chunks are those bytes.
 */
async function* wholeLineChunks(fh: FileHandle, start: number, end: number, take: (bytes: number) => Buffer): AsyncGenerator<Buffer> {
  let carry = Buffer.alloc(0);
  for (let position = start; position < end || carry.length > 0; ) {
    const buf = take(Math.max(Math.min(CHUNK_BYTES, end - position + carry.length), carry.length * 2, 1));
    let filled = carry.copy(buf);
    while (filled < buf.length && position < end) {
      const { bytesRead } = await fh.read(buf, filled, Math.min(buf.length - filled, end - position), position);
      if (bytesRead === 0) break;
      filled += bytesRead;
      position += bytesRead;
    }
    const eof = position >= end || filled < buf.length;
    const cut = eof ? filled : buf.lastIndexOf(10, filled - 1) + 1;
    if (cut === 0 && !eof) {
      carry = Buffer.from(buf.subarray(0, filled)); // one line longer than the chunk: grow
      continue;
    }
    carry = Buffer.from(buf.subarray(cut, filled));
    yield buf.subarray(0, cut);
    if (eof) return;
  }
}
