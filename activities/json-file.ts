// Reading the controller's own JSON files (snapshot manifest, commit file, fallback marker): one
// place that tells a missing file from one that is not JSON or fails its schema.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { z } from 'zod';
import { errorMessage } from './activity-context.js';

const isMissing = (err: unknown): boolean => ['ENOENT', 'ENOTDIR'].includes((err as NodeJS.ErrnoException | null)?.code ?? '');

/**
 * The file parsed and checked against `schema`: `undefined` when it does not exist; `bad(what)` is
 * thrown when it is not JSON or does not match (`what` names the file and the first problem).
 * Returns the raw value beside zod's copy, for callers that keep extras as written, and the bytes
 * read (for a caller that digests them).
 */
export async function readJsonFile<S extends z.ZodType>(
  file: string,
  schema: S,
  bad: (what: string) => Error,
): Promise<{ raw: unknown; data: z.infer<S>; bytes: Buffer } | undefined> {
  let bytes: Buffer;
  try {
    bytes = await fsp.readFile(file);
  } catch (err) {
    if (isMissing(err)) return undefined;
    throw err;
  }
  const name = path.basename(file);
  let raw: unknown;
  try {
    raw = JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    throw bad(`${name} is not JSON: ${errorMessage(err)}`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw bad(`${name} is invalid at ${issue.path.join('.') || '(root)'}: ${issue.message}`);
  }
  return { raw, data: parsed.data, bytes };
}
