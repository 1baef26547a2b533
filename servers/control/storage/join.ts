// The commit of a multi-worker server (docs/multi-worker.md): each worker has encoded its records
// and holds them as its part (held-part.ts); the front sizes the participant's one records file
// from the parts' sizes (§9.1: one file per participant, so a reader of the layout cannot tell
// several workers from one), has every worker write its part at its offset, in worker order, reads
// the file back once for its digest and the parts', and publishes it as writer.ts does for a
// single process: temp file, fsync, directories, rename, manifest last, create-once.
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { refuse } from '../../../protocol/errors.js';
import type { Manifest } from '../../../protocol/manifest.js';
import { manifestExtras } from './manifest.js';
import { participantDir, storageError, tempPath } from './paths.js';
import { publishRecordsFile, syncedManifest } from './writer.js';

export interface JoinOptions {
  checkpointDir: string;
  kind: string;
  instance: string;
  checkpointId: string;
  /** Each worker's commit manifest of its part (digest, count, `part_bytes`), in worker order. */
  parts: readonly Manifest[];
  /** Has worker `index` write its part into `file` at `offset`. */
  place: (index: number, file: string, offset: number) => Promise<void>;
  /** Checked right before the records file gets its name: a resume stops the join there. */
  stopped?: () => boolean;
}

const READ_CHUNK_BYTES = 8 << 20;

/**
 * The participant's directory, created: before its workers commit, so a directory that cannot be
 * is refused as a single process refuses it (no worker holds a part of a commit that failed).
 */
export async function joinDirectory(checkpointDir: string, kind: string, instance: string): Promise<string> {
  const dir = participantDir(checkpointDir, kind, instance);
  await fsp.mkdir(dir, { recursive: true }).catch((err: unknown) => {
    throw storageError(err, `writing the records of ${kind}/${instance}`);
  });
  return dir;
}

export async function joinWorkerRecords(opts: JoinOptions): Promise<Manifest> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance);
  const where = `${opts.kind}/${opts.instance}`;
  let tmp: string | undefined;
  try {
    const sizes = opts.parts.map((p, i) => {
      const bytes = (p as { part_bytes?: unknown }).part_bytes;
      if (!Number.isSafeInteger(bytes) || (bytes as number) < 0) throw refuse('invalid_checkpoint_state', `worker ${i} named no size of its records part`);
      return bytes as number;
    });
    await fsp.mkdir(dir, { recursive: true });
    tmp = tempPath(dir, 'records.jsonl');
    await (await fsp.open(tmp, 'wx')).close();
    const file = tmp;
    let offset = 0;
    await Promise.all(
      sizes.map((bytes, i) => {
        const at = offset;
        offset += bytes;
        return opts.place(i, file, at);
      }),
    );
    const whole = await digestParts(file, sizes, opts.parts);
    const count = opts.parts.reduce((n, p) => n + p.record_count, 0);
    // Where each worker's records are in the one file: a worker of a server with as many workers
    // reads its own part only at restore (reader.ts), the rest read the whole file.
    const workerParts = opts.parts.map((p, i) => ({ bytes: sizes[i]!, records: p.record_count, sha256: p.records_sha256 }));
    const extras = manifestExtras({ worker_parts: workerParts });
    const manifest = await syncedManifest({ ...opts, dir, extras, sha256: whole, count });
    if (opts.stopped?.()) throw refuse('invalid_checkpoint_state', 'the checkpoint was resumed before its write finished');
    tmp = undefined;
    return await publishRecordsFile({ dir, file, manifest, where, checkpointDir: opts.checkpointDir });
  } catch (err) {
    if (tmp) await fsp.rm(tmp, { force: true }).catch(() => {});
    throw storageError(err, `joining the workers' records of ${where}`);
  }
}

/**
 * Reads the joined file once: each part must be exactly what its worker hashed (a torn or missing
 * placement never publishes), and the whole file's digest names it. The file is fsynced here.
 */
async function digestParts(file: string, sizes: readonly number[], parts: readonly Manifest[]): Promise<string> {
  const whole = createHash('sha256');
  const fh = await fsp.open(file, 'r+');
  try {
    let part = 0;
    let left = sizes[0] ?? 0;
    let own = createHash('sha256');
    const endPart = (): void => {
      if (own.digest('hex') !== parts[part]!.records_sha256)
        throw refuse('invalid_checkpoint_state', `worker ${part}'s records part does not match its digest`);
      part++;
      left = sizes[part] ?? 0;
      own = createHash('sha256');
    };
    while (part < sizes.length && left === 0) endPart();
    // One buffer for the whole read: fresh memory per chunk costs more in page faults than the hashing.
    const buffer = Buffer.allocUnsafeSlow(READ_CHUNK_BYTES);
    for (let at = 0; ; ) {
      const { bytesRead } = await fh.read(buffer, 0, buffer.length, at);
      if (bytesRead === 0) break;
      at += bytesRead;
      let chunk = buffer.subarray(0, bytesRead);
      whole.update(chunk);
      while (chunk.length > 0) {
        if (part >= sizes.length) throw refuse('invalid_checkpoint_state', 'the joined records file is longer than its parts');
        const mine = chunk.subarray(0, left);
        own.update(mine);
        left -= mine.length;
        chunk = chunk.subarray(mine.length);
        while (part < sizes.length && left === 0) endPart();
      }
    }
    if (part < sizes.length) throw refuse('invalid_checkpoint_state', `worker ${part}'s records part is missing from the joined file`);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return whole.digest('hex');
}
