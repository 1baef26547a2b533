// A worker's part of its server's records file (docs/multi-worker.md). In a worker of a
// multi-worker server the commit write keeps its encoded records in memory (MemoryRecordsTarget)
// instead of writing a file of its own; once every worker has answered with its part's size, the
// front has each worker place its part at its offset of the participant's one records file
// (join.ts). The records are so written once, by the workers at the same time, and the front only
// reads the file back for its digest: copying the parts into one file was most of a join's cost.
//
// A worker holds the part of its latest commit until that checkpoint is resumed (a failed join
// is retried by a retried commit, which the worker answers from its first reply); then its buffers
// are kept for the next commit's part.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { refuse } from '../../../protocol/errors.js';
import { SHARED_CHUNK_BYTES } from './digest.js';
import { isTempPath } from './paths.js';
import { fileWrite, type RecordsTarget } from './records-sink.js';

export interface HeldPart {
  checkpointId: string;
  chunks: readonly Buffer[];
  bytes: number;
  /** The kept buffers the chunks are views of: back to the pool once the part is dropped and placed. */
  buffers: readonly Buffer[];
}

let held: HeldPart | undefined;
/** Placements under way, by part: a dropped part's buffers go back to the pool only after its last. */
const placing = new Map<HeldPart, number>();
const dropped = new Set<HeldPart>();

// The parts' buffers are kept by the process from one commit to the next, as the sink keeps its
// batches (records-sink.ts): fresh ones were megabytes of new external memory in every commit, each
// page faulted in by the copy, and external memory counts toward V8 starting a full collection.
const idleBuffers: Buffer[] = [];
/** At most this many kept (a part of a few batches each commit; a bigger one allocates the rest). */
const MAX_IDLE_BUFFERS = 8;

function takeBuffer(length: number): Buffer {
  const i = idleBuffers.findIndex((b) => b.length >= length);
  if (i >= 0) return idleBuffers.splice(i, 1)[0]!;
  return Buffer.allocUnsafeSlow(Math.max(length, SHARED_CHUNK_BYTES));
}

function returnBuffers(buffers: readonly Buffer[]): void {
  for (const b of buffers) if (idleBuffers.length < MAX_IDLE_BUFFERS) idleBuffers.push(b);
}

/** Where the records sink writes in a worker: in-order batches, each copied into a kept buffer (the sink reuses its own). */
export class MemoryRecordsTarget implements RecordsTarget {
  readonly chunks: Buffer[] = [];
  readonly buffers: Buffer[] = [];
  bytes = 0;

  async write(buffer: Buffer, offset: number, length: number, position: number): Promise<{ bytesWritten: number }> {
    if (position !== this.bytes) throw new Error(`records batch at ${position}, expected ${this.bytes}`);
    // Not Buffer.from(view): from a view of shared memory (the sink's batches) it copies element by element.
    const kept = takeBuffer(length);
    buffer.copy(kept, 0, offset, offset + length);
    this.buffers.push(kept);
    this.chunks.push(kept.subarray(0, length));
    this.bytes += length;
    return { bytesWritten: length };
  }

  /** A write that failed or was stopped: its buffers go back to the pool. */
  discard(): void {
    returnBuffers(this.buffers);
    this.buffers.length = 0;
    this.chunks.length = 0;
  }

  async sync(): Promise<void> {}
  async datasync(): Promise<void> {}
  async close(): Promise<void> {}
}

/** The part of `checkpointId` is now this worker's held part (replacing an earlier one). */
export function holdPart(part: HeldPart): void {
  if (held) release(held);
  held = part;
}

/** Forgets the part of `checkpointId` (its checkpoint was resumed). */
export function dropHeldPart(checkpointId: string): void {
  if (held?.checkpointId !== checkpointId) return;
  release(held);
  held = undefined;
}

function release(part: HeldPart): void {
  if (placing.has(part)) dropped.add(part);
  else returnBuffers(part.buffers);
}

/** Writes the held part of `checkpointId` into `file` (created by the front) at `offset`. */
export async function placeHeldPart(checkpointId: string, file: string, offset: number): Promise<{ bytes: number }> {
  const part = held;
  if (part?.checkpointId !== checkpointId) {
    throw refuse('invalid_checkpoint_state', `no records part of checkpoint '${checkpointId}' is held here (resumed, or another commit since)`);
  }
  if (!path.isAbsolute(file) || !isTempPath(file, 'records.jsonl')) throw refuse('invalid_request', `not a join's temporary records file: ${file}`);
  placing.set(part, (placing.get(part) ?? 0) + 1);
  try {
    const fh = await fsp.open(file, 'r+');
    try {
      let at = offset;
      for (const chunk of part.chunks) {
        await fileWrite(fh, chunk, at);
        at += chunk.length;
      }
    } finally {
      await fh.close();
    }
  } finally {
    const left = placing.get(part)! - 1;
    if (left > 0) placing.set(part, left);
    else {
      placing.delete(part);
      if (dropped.delete(part)) returnBuffers(part.buffers);
    }
  }
  return { bytes: part.bytes };
}
