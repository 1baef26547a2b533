// The SHA-256 of a records file as it streams by (§9.3). One chunk is hashed inline when the
// stream ends; from the second chunk on, the hash thread does it, beside the main thread's
// encoding or parsing. Chunks are shared memory, so nothing is copied on the way.
import { createHash } from 'node:crypto';
import { runHash } from './workers.js';

let nextStream = 0;

export class RecordsDigest {
  private readonly stream = ++nextStream;
  private held: { data: Buffer; hashed: () => void } | undefined;
  private chunks = 0;
  private bytes = 0;
  private last: Promise<void> = Promise.resolve();

  /** Resolves once `data` is hashed (its memory may then be reused). */
  update(data: Buffer): Promise<void> {
    this.bytes += data.length;
    if (this.chunks++ === 0) return new Promise<void>((hashed) => (this.held = { data, hashed }));
    const held = this.held;
    this.held = undefined;
    if (held) void this.send(held.data).then(held.hashed, held.hashed);
    return this.send(data);
  }

  async digest(): Promise<string> {
    if (this.chunks < 2) {
      const hash = createHash('sha256').update(this.held?.data ?? Buffer.alloc(0));
      this.held?.hashed();
      return hash.digest('hex');
    }
    await this.last;
    const { bytes, hex } = await runHash({ op: 'digest', stream: this.stream });
    // A hash thread that died and came back holds another stream: never trust its digest.
    if (bytes !== this.bytes) throw new Error(`the hash thread saw ${bytes} of ${this.bytes} bytes`);
    return hex!;
  }

  /** Frees an abandoned stream's state in the hash thread. */
  drop(): void {
    this.held?.hashed();
    if (this.chunks > 1) void this.last.then(() => runHash({ op: 'drop', stream: this.stream })).catch(() => {});
  }

  /** One update at a time: the pool does not keep the order of queued tasks. */
  private send(data: Buffer): Promise<void> {
    const sent = this.last.then(() => runHash({ op: 'update', stream: this.stream, data })).then(() => {});
    this.last = sent.catch(() => {});
    return sent;
  }
}

/** Memory the hash thread can read without a copy. */
export function sharedBuffer(bytes: number): Buffer {
  return Buffer.from(new SharedArrayBuffer(bytes));
}

/** The shared memory kept by the process between uses: a records writer's batch, a count-only reader's chunk. */
export const SHARED_CHUNK_BYTES = 8 << 20;
/**
 * Whole chunks not in use. Fresh shared memory counts toward V8 starting a full collection, and a
 * process holding thousands of episodes (a Gym server) or parked `/run`s (the controller's worker)
 * then marks a heap of hundreds of MB inside or next to a checkpoint; kept, it mostly does not
 * (docs/performance.md). As many as one writer, or two readers side by side, use at once.
 */
const idleChunks: Buffer[] = [];
const MAX_IDLE_CHUNKS = 4;

/** A kept chunk when `bytes` is a whole chunk and one is idle; fresh shared memory of `bytes` otherwise. */
export function takeSharedChunk(bytes: number): Buffer {
  return (bytes === SHARED_CHUNK_BYTES ? idleChunks.pop() : undefined) ?? sharedBuffer(bytes);
}

/** Keeps a whole chunk for the next take (its user is done with every view into it). */
export function returnSharedChunk(buf: Buffer): void {
  if (buf.buffer.byteLength === SHARED_CHUNK_BYTES && idleChunks.length < MAX_IDLE_CHUNKS) idleChunks.push(Buffer.from(buf.buffer));
}
