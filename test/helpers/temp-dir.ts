// One temp-dir fixture for the suite: a fresh directory under the OS temp dir, removed after the
// test that made it (in the test or its beforeEach) or, with lifetime 'file' (made at the top of a
// file or in beforeAll, or used by servers that live as long as the file), after the file.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach } from 'vitest';

const testDirs: string[] = [];
const fileDirs: string[] = [];
const remove = (dirs: string[]) => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
};
afterEach(() => remove(testDirs));
afterAll(() => remove(fileDirs));

export function tempDir(prefix: string, lifetime: 'test' | 'file' = 'test'): string {
  const dir = mkdtempSync(join(tmpdir(), `${prefix}-`));
  (lifetime === 'test' ? testDirs : fileDirs).push(dir);
  return dir;
}
