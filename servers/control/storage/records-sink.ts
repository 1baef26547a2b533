// The records file as it is written (§9.4–9.5): each record checked for its episode and encoded
// once, straight into large byte batches (never held as JS strings); each batch is written at its
// file position and hashed while the next one is encoded.
import { refuse } from '../../../protocol/errors.js';
import { captureKey, decodeEpisodeId } from '../../../protocol/ids.js';
import { JsonLineEncoder, LosslessJsonError } from '../../../protocol/lossless-json.js';
import { RecordsDigest, SHARED_CHUNK_BYTES, returnSharedChunk, takeSharedChunk } from './digest.js';
import { describeValue } from './paths.js';
import { isPlainObject } from './record-lines.js';

/** Where the bytes go: an open records file (a `FileHandle`), or a worker's part in memory (held-part.ts). */
export interface RecordsTarget {
  write(buffer: Buffer, offset: number, length: number, position: number): Promise<{ bytesWritten: number }>;
  sync(): Promise<void>;
  datasync(): Promise<void>;
  close(): Promise<void>;
}

/** A batch is one kept chunk of shared memory (digest.ts). */
const BATCH_BYTES = SHARED_CHUNK_BYTES;
/** Batches written at once before the encoder waits for the disk. */
const MAX_INFLIGHT_BATCHES = 3;
/** Start an fdatasync after this many unsynced bytes, so the final fsync has little left to do. */
const EARLY_SYNC_BYTES = 64 << 20;

// The encoder's memory (its WebAssembly kernels' batch and scratch) and the batch buffers are kept
// by the process from one commit to the next instead of being allocated afresh for each: with
// fresh ones, a server holding thousands of episodes collected its whole heap inside nearly every
// checkpoint (external memory counts toward V8 starting a full collection); kept, it mostly does
// not (docs/performance.md). The batches are digest.ts's kept chunks.
/** Encoders not in use. */
const idleEncoders: PooledEncoder[] = [];

/** An encoder whose batches go to the sink that holds it now. */
class PooledEncoder {
  to: ((chunk: Buffer) => void) | undefined;
  readonly encoder = new JsonLineEncoder((chunk) => this.to!(chunk), BATCH_BYTES);
}

function takeEncoder(to: (chunk: Buffer) => void): PooledEncoder {
  const pooled = idleEncoders.pop() ?? new PooledEncoder();
  pooled.to = to;
  return pooled;
}

/** Back to the pool only when it holds nothing of its last sink (a failed line may leave bytes). */
function returnEncoder(pooled: PooledEncoder): void {
  pooled.to = undefined;
  if (pooled.encoder.buffered === 0) idleEncoders.push(pooled);
}

function takeBatch(bytes: number): Buffer {
  return takeSharedChunk(Math.max(BATCH_BYTES, bytes));
}

export class RecordsSink {
  private readonly pooled = takeEncoder((chunk) => this.emit(chunk));
  private readonly encoder = this.pooled.encoder;
  /** Whether this sink still holds its encoder (given back once, at finish or abort). */
  private holdsEncoder = true;
  private readonly digest = new RecordsDigest();
  private inflight: Promise<void>[] = [];
  private pos = 0;
  private count = 0;
  private unsynced = 0;
  private syncing: Promise<void> = Promise.resolve();
  private failure: unknown;
  private closed = false;

  /** `sync: false`: nothing is fsynced (a worker's part, joined and made durable by its front). */
  constructor(
    private readonly fh: RecordsTarget,
    private readonly opts: { sync: boolean } = { sync: true },
  ) {}

  /** Appends one record; after a full batch, a promise that yields to the event loop (control routes stay served) and to the disk. */
  add(record: object): Promise<void> | undefined {
    const ep = isPlainObject(record) ? decodeEpisodeId(record.episode_id) : undefined;
    if (!ep)
      throw refuse('invalid_checkpoint_state', `a record to write has no valid episode_id (${describeValue((record as { episode_id?: unknown }).episode_id)})`);
    const before = this.pos;
    try {
      this.encoder.writeLine(record);
    } catch (err) {
      if (!(err instanceof LosslessJsonError)) throw err;
      throw refuse('invalid_checkpoint_state', `the record of episode ${captureKey(ep)} cannot be serialized: ${err.message}`);
    }
    this.count++;
    return this.pos === before ? undefined : this.pause();
  }

  private async pause(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve));
    while (this.inflight.length >= MAX_INFLIGHT_BATCHES) await this.inflight.shift();
    if (this.failure !== undefined) throw this.failure;
  }

  async finish(): Promise<{ sha256: string; count: number }> {
    this.encoder.flush();
    this.releaseEncoder();
    // The digest first: a single batch is hashed only then, and its write waits for that.
    const [sha256] = await Promise.all([this.digest.digest(), ...this.inflight, this.syncing]);
    if (this.failure !== undefined) throw this.failure;
    if (this.opts.sync) await this.fh.sync();
    this.closed = true;
    await this.fh.close();
    return { sha256, count: this.count };
  }

  /** After a failure: let in-flight work settle, then close the file. */
  async abort(): Promise<void> {
    this.releaseEncoder();
    this.digest.drop();
    await Promise.allSettled([...this.inflight, this.syncing]);
    if (!this.closed) await this.fh.close().catch(() => {});
    this.closed = true;
  }

  private releaseEncoder(): void {
    if (!this.holdsEncoder) return;
    this.holdsEncoder = false;
    returnEncoder(this.pooled);
  }

  /** A batch from the encoder: a view valid only now, so it is copied for the write and the hash. */
  private emit(chunk: Buffer): void {
    const buf = takeBatch(chunk.length);
    chunk.copy(buf);
    const data = buf.subarray(0, chunk.length);
    const done = Promise.all([fileWrite(this.fh, data, this.pos), this.digest.update(data)]).then(
      () => returnSharedChunk(buf),
      (err: unknown) => void (this.failure ??= err),
    );
    this.pos += chunk.length;
    this.inflight.push(done);
    this.unsynced += chunk.length;
    if (this.opts.sync && this.unsynced >= EARLY_SYNC_BYTES) {
      // Starts disk writeback while we keep encoding (dirty pages otherwise wait for the fsync).
      this.unsynced = 0;
      const written = [...this.inflight, this.syncing];
      this.syncing = Promise.all(written)
        .then(() => this.fh.datasync())
        .catch((err: unknown) => void (this.failure ??= err));
    }
  }
}

/** Writes all of `data` at `position` (a write may take less than it was given). */
export async function fileWrite(fh: RecordsTarget, data: Buffer, position: number): Promise<void> {
  for (let done = 0; done < data.length; ) {
    const { bytesWritten } = await fh.write(data, done, data.length - done, position + done);
    if (bytesWritten <= 0) throw new Error('write made no progress');
    done += bytesWritten;
  }
}
