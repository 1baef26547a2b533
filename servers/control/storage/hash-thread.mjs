// The hash thread (see workers.ts): running SHA-256 streams, so a records file is hashed beside
// the main thread's encoding or parsing. Plain JavaScript with no TypeScript imports on purpose:
// it starts in tens of milliseconds, where a thread that registers tsx first takes a few hundred
// of CPU, which the first commit or restore of every process would pay.
import { createHash } from 'node:crypto';

/** @type {Map<number, { hash: import('node:crypto').Hash, bytes: number }>} */
const streams = new Map();

/**
 * @param {{ op: 'update', stream: number, data: Uint8Array } | { op: 'digest' | 'drop', stream: number }} task
 * @returns {{ bytes: number, hex?: string }} updates: the stream's byte count; digest: the hex digest too
 */
export default function hash(task) {
  if (task.op === 'drop') {
    streams.delete(task.stream);
    return { bytes: 0 };
  }
  let s = streams.get(task.stream);
  if (!s) streams.set(task.stream, (s = { hash: createHash('sha256'), bytes: 0 }));
  if (task.op === 'update') {
    s.hash.update(task.data);
    s.bytes += task.data.length;
    return { bytes: s.bytes };
  }
  streams.delete(task.stream);
  return { bytes: s.bytes, hex: s.hash.digest('hex') };
}
