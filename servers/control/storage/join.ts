// The commit of a multi-worker server (docs/multi-worker.md): each worker has written and published
// its own records under a hidden directory of the participant's; the front joins them, in worker
// order, into the participant's one records file (§9.1: one file per participant, so a reader of
// the layout cannot tell several workers from one) and publishes the one manifest, as writer.ts
// does for a single process: temp file, fsync, directories, rename, manifest last, create-once.
import { createHash } from 'node:crypto';
import { createReadStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { refuse } from '../../../protocol/errors.js';
import type { Manifest } from '../../../protocol/manifest.js';
import { manifestExtras, readManifest } from './manifest.js';
import { participantDir, storageError, tempPath } from './paths.js';
import { publishRecordsFile, syncedManifest } from './writer.js';

export interface WorkerPart {
  /** The worker's participant directory (where its manifest and records file are). */
  dir: string;
  manifest: Manifest;
}

export interface JoinOptions {
  checkpointDir: string;
  kind: string;
  instance: string;
  checkpointId: string;
  parts: readonly WorkerPart[];
  extras?: Record<string, unknown>;
  /** Checked right before the records file gets its name: a resume stops the join there. */
  stopped?: () => boolean;
}

/** Where worker `index` of a server writes its part of checkpoint `participant` (hidden: readers ignore it). */
const COPY_CHUNK_BYTES = 8 << 20;

export function workerPartDir(participant: string, index: number): string {
  return path.join(participant, `.worker-${index}`);
}

export async function joinWorkerRecords(opts: JoinOptions): Promise<Manifest> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance);
  const where = `${opts.kind}/${opts.instance}`;
  const first = opts.parts[0];
  const firstFile = first && path.join(first.dir, first.manifest.records_file);
  let tmp: string | undefined;
  /** Set while the first part is the temp file: a failed join puts it back, so a retry joins again. */
  let firstSize: number | undefined;
  try {
    await fsp.mkdir(dir, { recursive: true });
    tmp = tempPath(dir, 'records.jsonl');
    // The first part becomes the file's beginning by a rename, not a copy (on this machine's disk,
    // writing is what a join costs); the others are appended. Each part is read once, for its own
    // digest (a torn part never joins) and the file's.
    if (firstFile) {
      try {
        await fsp.rename(firstFile, tmp);
      } catch (err) {
        const joined = (err as NodeJS.ErrnoException).code === 'ENOENT' ? await alreadyJoined(dir, opts) : undefined;
        if (joined) return joined;
        throw err;
      }
      firstSize = (await fsp.stat(tmp)).size;
    }
    const whole = createHash('sha256');
    let count = 0;
    // Where each worker's records are in the one file: a worker of a server with as many workers
    // reads its own part only at restore (reader.ts), the rest read the whole file.
    const workerParts: Array<{ bytes: number; records: number; sha256: string }> = [];
    const fh = await fsp.open(tmp, firstFile ? 'r+' : 'wx');
    try {
      let end = 0;
      for (const part of opts.parts) {
        const own = createHash('sha256');
        let bytes = 0;
        const appended = part !== first;
        for await (const chunk of createReadStream(appended ? path.join(part.dir, part.manifest.records_file) : tmp, { highWaterMark: COPY_CHUNK_BYTES })) {
          own.update(chunk as Buffer);
          whole.update(chunk as Buffer);
          if (appended) await fh.write(chunk as Buffer, 0, (chunk as Buffer).length, end + bytes);
          bytes += (chunk as Buffer).length;
        }
        if (own.digest('hex') !== part.manifest.records_sha256)
          throw refuse('invalid_checkpoint_state', `the records part in ${part.dir} does not match its manifest`);
        end += bytes;
        count += part.manifest.record_count;
        workerParts.push({ bytes, records: part.manifest.record_count, sha256: part.manifest.records_sha256 });
      }
      await fh.sync();
    } finally {
      await fh.close();
    }
    const extras = manifestExtras({ ...opts.extras, worker_parts: workerParts });
    const manifest = await syncedManifest({ ...opts, dir, extras, sha256: whole.digest('hex'), count });
    if (opts.stopped?.()) throw refuse('invalid_checkpoint_state', 'the checkpoint was resumed before its write finished');
    const file = tmp;
    tmp = undefined;
    firstSize = undefined;
    return await publishRecordsFile({ dir, file, manifest, where, checkpointDir: opts.checkpointDir });
  } catch (err) {
    if (tmp && firstSize !== undefined && firstFile) {
      // The first part back where its worker wrote it, as it was.
      await fsp
        .truncate(tmp, firstSize)
        .then(() => fsp.rename(tmp!, firstFile))
        .catch(() => fsp.rm(tmp!, { force: true }).catch(() => {}));
    } else if (tmp) await fsp.rm(tmp, { force: true }).catch(() => {});
    throw storageError(err, `joining the workers' records of ${where}`);
  }
}

/** A join that already published (its first part is the records file now): its manifest, if it is of these parts. */
async function alreadyJoined(dir: string, opts: JoinOptions): Promise<Manifest | undefined> {
  let published: Manifest & { worker_parts?: Array<{ sha256: string }> };
  try {
    published = await readManifest(dir, opts.kind, opts.instance, `${opts.kind}/${opts.instance}`);
  } catch {
    return undefined;
  }
  const same =
    published.checkpoint_id === opts.checkpointId &&
    published.worker_parts?.length === opts.parts.length &&
    published.worker_parts.every((w, i) => w.sha256 === opts.parts[i]!.manifest.records_sha256);
  return same ? published : undefined;
}
