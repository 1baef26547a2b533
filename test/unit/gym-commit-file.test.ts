import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { takeGymCommitFile, writeGymCommitFile } from '../../activities/gym-commit-file.js';
import { GYM_COMMIT_FILE, type GymCommitFile } from '../../protocol/controller.js';
import { tempDir } from '../helpers/temp-dir.js';

const bad = (what: string): Error => new Error(`bad: ${what}`);
const commitOf = (checkpoint_id: string): GymCommitFile => ({
  checkpoint_id,
  scope: ['r0', 'r1'],
  participants: { env: { kind: 'environment', instance: 'env', manifest: { records_file: 'x' }, episode_ids: ['r0', 'r1'] } },
});

describe('the snapshot commit file', () => {
  it('is taken from the process that wrote it once, then read from the file', async () => {
    const dir = tempDir('commit-file');
    const written = commitOf('c1');
    await writeGymCommitFile(dir, written);
    expect(JSON.parse(await fsp.readFile(path.join(dir, GYM_COMMIT_FILE), 'utf8'))).toEqual(written);
    // The file changed behind us: the writer's own copy is what it committed.
    await fsp.writeFile(path.join(dir, GYM_COMMIT_FILE), JSON.stringify({ ...written, scope: ['r0'] }));
    expect(await takeGymCommitFile(dir, 'c1', bad)).toBe(written);
    // Taken: a retried finalize reads and checks the file.
    expect((await takeGymCommitFile(dir, 'c1', bad))?.scope).toEqual(['r0']);
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
    const first = await takeGymCommitFile(dirs[0]!, 'c0', bad);
    expect(first).toEqual({
      checkpoint_id: 'c0',
      scope: ['r0', 'r1'],
      participants: { env: { kind: 'environment', instance: 'env', episode_ids: ['r0', 'r1'] } },
    });
    expect(first).not.toBe(commits[0]);
    expect(await takeGymCommitFile(dirs[5]!, 'c5', bad)).toBe(commits[5]);
  });
});
