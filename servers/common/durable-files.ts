// File durability shared by checkpoint storage and the snapshot and trainer activities: a
// published file or directory entry must survive a host crash (temp file, fsync, rename).
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';

/** fsync a file or directory by path. */
export async function fsyncPath(p: string): Promise<void> {
  const fh = await fsp.open(p, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Temp file, fsync, rename over `file`, fsync the directory. */
export async function writeFileDurably(file: string, data: Buffer | string): Promise<void> {
  await replaceFile(file, data, true);
  await fsyncPath(path.dirname(file));
}

/**
 * Temp file and rename, without the fsyncs: for a file inside a temp snapshot, which the
 * publication fsyncs as a whole before its rename (a crash before then discards the directory).
 */
export async function writeFileAtomically(file: string, data: Buffer | string): Promise<void> {
  await replaceFile(file, data, false);
}

async function replaceFile(file: string, data: Buffer | string, sync: boolean): Promise<void> {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${randomBytes(8).toString('hex')}`);
  try {
    const fh = await fsp.open(tmp, 'wx');
    try {
      await fh.writeFile(data);
      if (sync) await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.rename(tmp, file);
  } catch (err) {
    await fsp.rm(tmp, { force: true }).catch(() => {});
    throw err;
  }
}
