// The snapshot's commit file (`GYM_COMMIT_FILE`): the Gym commit's scope and every participant's
// episode IDs, written by the commit into the temp snapshot; the finalize checks it against the
// commit and names it in the manifest with its digest, so the lists stay out of the workflow's
// history and are written once. Both run while Gym admission is closed, usually in the same
// worker: the process that wrote a file keeps what it wrote (and its digest) until its finalize
// takes it, instead of reading the file back and checking every ID again (tens of thousands of
// strings at a large checkpoint, most of the finalize's garbage in the worker). A finalize in
// another process, or a retry, reads the file.
import { createHash } from 'node:crypto';
import path from 'node:path';
import { z } from 'zod';
import { GYM_COMMIT_FILE, type FileDigest, type GymCommitFile } from '../protocol/controller.js';
import { writeFileAtomically } from '../servers/common/durable-files.js';
import { readJsonFile } from './json-file.js';

const GymCommitFileSchema = z.object({
  checkpoint_id: z.string(),
  scope: z.array(z.string()),
  participants: z.record(z.string(), z.object({ kind: z.string(), instance: z.string(), episode_ids: z.array(z.string()) })),
});

/** What a finalize needs of the file (a participant's manifest comes from the workflow's commit outcome). */
export type GymCommitLists = z.infer<typeof GymCommitFileSchema>;

/** The lists a finalize needs, and the file's digest for the manifest. */
export interface TakenCommitFile {
  lists: GymCommitLists;
  digest: FileDigest;
}

/** By checkpoint ID and directory: a failed attempt's sequence (so its directory) is reused by the next, never its ID. */
const written = new Map<string, TakenCommitFile>();
/** Commits whose finalize never ran (an aborted attempt) are dropped past this many. */
const KEEP_AT_MOST = 4;

const memoKey = (dir: string, checkpointId: string): string => `${checkpointId}\n${path.resolve(dir)}`;

function digestOf(data: Buffer): FileDigest {
  return { file: GYM_COMMIT_FILE, sha256: createHash('sha256').update(data).digest('hex'), bytes: data.length };
}

/** Writes the file (no fsync: the publication fsyncs the whole directory before its rename) and keeps it for the finalize. */
export async function writeGymCommitFile(dir: string, file: GymCommitFile): Promise<FileDigest> {
  const key = memoKey(dir, file.checkpoint_id);
  written.delete(key);
  const data = Buffer.from(JSON.stringify(file), 'utf8');
  await writeFileAtomically(path.join(dir, GYM_COMMIT_FILE), data);
  const digest = digestOf(data);
  written.set(key, { lists: file, digest });
  while (written.size > KEEP_AT_MOST) written.delete(written.keys().next().value!);
  return digest;
}

/**
 * The commit file of `checkpointId` in `dir`, with its digest: the one this process wrote (taken:
 * a retry reads the file), else read and checked. `undefined` when there is none; `bad(what)` for a
 * file that is not a commit file, or one of another checkpoint.
 */
export async function takeGymCommitFile(dir: string, checkpointId: string, bad: (what: string) => Error): Promise<TakenCommitFile | undefined> {
  const key = memoKey(dir, checkpointId);
  const mine = written.get(key);
  if (mine) {
    written.delete(key);
    return mine;
  }
  const read = await readJsonFile(path.join(dir, GYM_COMMIT_FILE), GymCommitFileSchema, bad);
  if (!read) return undefined;
  if (read.data.checkpoint_id !== checkpointId)
    throw bad(`${GYM_COMMIT_FILE} is of checkpoint ${JSON.stringify(read.data.checkpoint_id)}, not ${checkpointId}`);
  return { lists: read.data, digest: digestOf(read.bytes) };
}
