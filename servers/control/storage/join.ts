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
import { manifestExtras } from './manifest.js';
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
  let tmp: string | undefined;
  try {
    await fsp.mkdir(dir, { recursive: true });
    tmp = tempPath(dir, 'records.jsonl');
    const whole = createHash('sha256');
    let count = 0;
    // Where each worker's records are in the one file: a worker of a server with as many workers
    // reads its own part only at restore (reader.ts), the rest read the whole file.
    const workerParts: Array<{ bytes: number; records: number; sha256: string }> = [];
    const fh = await fsp.open(tmp, 'wx');
    try {
      for (const part of opts.parts) {
        // Each part checked against its own manifest on the way: a torn part never joins.
        const own = createHash('sha256');
        let bytes = 0;
        for await (const chunk of createReadStream(path.join(part.dir, part.manifest.records_file), { highWaterMark: COPY_CHUNK_BYTES })) {
          own.update(chunk as Buffer);
          whole.update(chunk as Buffer);
          await fh.write(chunk as Buffer);
          bytes += (chunk as Buffer).length;
        }
        if (own.digest('hex') !== part.manifest.records_sha256)
          throw refuse('invalid_checkpoint_state', `the records part in ${part.dir} does not match its manifest`);
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
    return await publishRecordsFile({ dir, file, manifest, where, checkpointDir: opts.checkpointDir });
  } catch (err) {
    if (tmp) await fsp.rm(tmp, { force: true }).catch(() => {});
    throw storageError(err, `joining the workers' records of ${where}`);
  }
}
