import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { takeGymCommitFile, writeGymCommitFile } from '../../activities/gym-commit-file.js';
import { GYM_COMMIT_FILE, type GymCommitFile } from '../../protocol/controller.js';
import { tempDir } from '../helpers/temp-dir.js';

const bad = (what: string): Error => new Error(`bad: ${what}`);
const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
const commitOf = (checkpoint_id: string): GymCommitFile => ({
  checkpoint_id,
  scope: ['r0', 'r1'],
  participants: { env: { kind: 'environment', instance: 'env', manifest: { records_file: 'x' }, episode_ids: ['r0', 'r1'] } },
});

describe('the snapshot commit file', () => {
  it('is taken from the process that wrote it once, then read from the file', async () => {
    const dir = tempDir('commit-file');
    const written = commitOf('c1');
    const digest = await writeGymCommitFile(dir, written);
    const bytes = await fsp.readFile(path.join(dir, GYM_COMMIT_FILE));
    expect(JSON.parse(bytes.toString())).toEqual(written);
    expect(digest).toEqual({ file: GYM_COMMIT_FILE, sha256: sha256(bytes), bytes: bytes.length });
    // The file changed behind us: the writer's own copy is what it committed.
    const changed = JSON.stringify({ ...written, scope: ['r0'] });
    await fsp.writeFile(path.join(dir, GYM_COMMIT_FILE), changed);
    const taken = await takeGymCommitFile(dir, 'c1', bad);
    expect(taken?.lists).toBe(written);
    expect(taken?.digest).toEqual(digest);
    // Taken: a retried finalize reads and checks the file, and digests what it read.
    const read = await takeGymCommitFile(dir, 'c1', bad);
    expect(read?.lists.scope).toEqual(['r0']);
    expect(read?.digest).toEqual({ file: GYM_COMMIT_FILE, sha256: sha256(Buffer.from(changed)), bytes: changed.length });
  });

  it('never hands a finalize the commit of another checkpoint in the same directory', async () => {
    const dir = tempDir('commit-file');
    await writeGymCommitFile(dir, commitOf('old'));
    await expect(takeGymCommitFile(dir, 'new', bad)).rejects.toThrow(/of checkpoint "old", not new/);
    await fsp.rm(path.join(dir, GYM_COMMIT_FILE));
    expect(await takeGymCommitFile(dir, 'other', bad)).toBeUndefined();
    await fsp.writeFile(path.join(dir, GYM_COMMIT_FILE), '{"checkpoint_id": 1}');
    await expect(takeGymCommitFile(dir, 'other', bad)).rejects.toThrow(/is invalid at/);
  });

  it('keeps only the last few commits a finalize never took', async () => {
    const dirs = Array.from({ length: 6 }, () => tempDir('commit-file'));
    const commits = dirs.map((_, i) => commitOf(`c${i}`));
    for (const [i, dir] of dirs.entries()) await writeGymCommitFile(dir, commits[i]!);
    // The oldest were dropped: their finalize reads the file (an equal copy, not the object).
    const first = (await takeGymCommitFile(dirs[0]!, 'c0', bad))?.lists;
    expect(first).toEqual({
      checkpoint_id: 'c0',
      scope: ['r0', 'r1'],
      participants: { env: { kind: 'environment', instance: 'env', episode_ids: ['r0', 'r1'] } },
    });
    expect(first).not.toBe(commits[0]);
    expect((await takeGymCommitFile(dirs[5]!, 'c5', bad))?.lists).toBe(commits[5]);
  });
});
