// A worker's part of its server's records file (docs/multi-worker.md). In a worker of a
// multi-worker server the commit write keeps its encoded records in memory (MemoryRecordsTarget)
// instead of writing a file of its own; once every worker has answered with its part's size, the
// front has each worker place its part at its offset of the participant's one records file
// (join.ts). The records are so written once, by the workers at the same time, and the front only
// reads the file back for its digest: copying the parts into one file was most of a join's cost.
//
// A worker holds the part of its latest commit until that checkpoint is resumed (a failed join
// is retried by a retried commit, which the worker answers from its first reply).
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { refuse } from '../../../protocol/errors.js';
import { isTempPath } from './paths.js';
import { fileWrite, type RecordsTarget } from './records-sink.js';

export interface HeldPart {
  checkpointId: string;
  chunks: readonly Buffer[];
  bytes: number;
}

let held: HeldPart | undefined;

/** Where the records sink writes in a worker: in-order batches, each copied (the sink reuses its buffers). */
export class MemoryRecordsTarget implements RecordsTarget {
  readonly chunks: Buffer[] = [];
  bytes = 0;

  async write(buffer: Buffer, offset: number, length: number, position: number): Promise<{ bytesWritten: number }> {
    if (position !== this.bytes) throw new Error(`records batch at ${position}, expected ${this.bytes}`);
    // Not Buffer.from(view): from a view of shared memory (the sink's batches) it copies element by element.
    const copy = Buffer.allocUnsafeSlow(length);
    buffer.copy(copy, 0, offset, offset + length);
    this.chunks.push(copy);
    this.bytes += length;
    return { bytesWritten: length };
  }

  async sync(): Promise<void> {}
  async datasync(): Promise<void> {}
  async close(): Promise<void> {}
}

/** The part of `checkpointId` is now this worker's held part (replacing an earlier one). */
export function holdPart(part: HeldPart): void {
  held = part;
}

/** Forgets the part of `checkpointId` (its checkpoint was resumed). */
export function dropHeldPart(checkpointId: string): void {
  if (held?.checkpointId === checkpointId) held = undefined;
}

/** Writes the held part of `checkpointId` into `file` (created by the front) at `offset`. */
export async function placeHeldPart(checkpointId: string, file: string, offset: number): Promise<{ bytes: number }> {
  const part = held;
  if (part?.checkpointId !== checkpointId) {
    throw refuse('invalid_checkpoint_state', `no records part of checkpoint '${checkpointId}' is held here (resumed, or another commit since)`);
  }
  if (!path.isAbsolute(file) || !isTempPath(file, 'records.jsonl')) throw refuse('invalid_request', `not a join's temporary records file: ${file}`);
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
  return { bytes: part.bytes };
}
