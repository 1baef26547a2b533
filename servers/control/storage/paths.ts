// Where a participant's files live (§9.1), and the one refusal every storage failure becomes (§9.7).
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { ProtocolError, refuse } from '../../../protocol/errors.js';
import { isSafePathComponent } from '../../../protocol/ids.js';
import { stringifyLossless } from '../../../protocol/lossless-json.js';

/** `<checkpoint_dir>/gym/<kind>/<instance>`; refuses unsafe path components (§9.1). */
export function participantDir(checkpointDir: string, kind: string, instance: string): string {
  for (const [what, v] of Object.entries({ kind, instance })) {
    if (typeof v !== 'string' || !isSafePathComponent(v)) throw refuse('invalid_checkpoint_state', `${what} ${JSON.stringify(v)} is not a safe path component`);
  }
  return path.join(checkpointDir, 'gym', kind, instance);
}

/** A hidden, unique temporary name beside `name` in `dir` (never a records file or manifest name). */
export function tempPath(dir: string, name: string): string {
  return path.join(dir, `.${name}.${randomBytes(8).toString('hex')}`);
}

/** Whether `file` is a name `tempPath` gives for `name`. */
export function isTempPath(file: string, name: string): boolean {
  const base = path.basename(file);
  const prefix = `.${name}.`;
  return base.startsWith(prefix) && /^[0-9a-f]{16}$/.test(base.slice(prefix.length));
}

/** Any failure of a storage call as `invalid_checkpoint_state` (§9.7), never an untyped error. */
export function storageError(err: unknown, context: string): ProtocolError {
  if (err instanceof ProtocolError) return err;
  const e = err as NodeJS.ErrnoException;
  const what = e?.code ? `${e.code}: ${e.message}` : (e?.message ?? String(err));
  return refuse('invalid_checkpoint_state', `${context}: ${what}`);
}

/** A short rendering of a bad field for an error detail. */
export function describeValue(v: unknown): string {
  if (v === undefined) return '(missing)';
  let text: string;
  try {
    text = stringifyLossless(v);
  } catch {
    text = String(v);
  }
  return text.length > 120 ? `${text.slice(0, 120)}…` : text;
}
