// The participant manifest (§9.2, §9.5 step 6): created once and never replaced (a hard link never
// replaces a name, so of two racing writers exactly one publishes), and checked field by field
// when read (§9.6 steps 1–2).
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { sortKeysDeep } from '../../../protocol/canonical-json.js';
import { refuse } from '../../../protocol/errors.js';
import { LosslessNumber, parseLossless } from '../../../protocol/lossless-json.js';
import { MANIFEST_FILE, ManifestSchema, RECORDS_FILE_PATTERN, SCHEMA_VERSION, type Manifest } from '../../../protocol/manifest.js';
import { fsyncPath } from '../../common/durable-files.js';
import { describeValue, tempPath } from './paths.js';
import { isPlainObject } from './record-lines.js';

/** Kind-specific manifest fields, checked before anything is written: plain JSON, no core field. */
export function manifestExtras(extras: Record<string, unknown> | undefined): Record<string, unknown> {
  if (!extras) return {};
  for (const key of Object.keys(ManifestSchema.shape)) {
    if (Object.hasOwn(extras, key)) throw refuse('invalid_checkpoint_state', `manifest extras may not set ${key}`);
  }
  try {
    // Normalized through JSON so the manifest equals what a reader of the published file gets.
    return JSON.parse(JSON.stringify(extras)) as Record<string, unknown>;
  } catch (err) {
    throw refuse('invalid_checkpoint_state', `manifest extras are not JSON: ${(err as Error).message}`);
  }
}

/** Creates `manifest.json` only if absent (durably: fsynced, as is its directory); returns `manifest`, or the one already there. */
export async function publishManifest(dir: string, manifest: Manifest): Promise<Record<string, unknown>> {
  const tmp = tempPath(dir, MANIFEST_FILE);
  const target = path.join(dir, MANIFEST_FILE);
  let created = false;
  try {
    const fh = await fsp.open(tmp, 'wx');
    try {
      // As the reference writes it: keys sorted at every level, one-space indent, no trailing newline.
      await fh.writeFile(JSON.stringify(sortKeysDeep(manifest), null, 1));
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.link(tmp, target).then(
      () => (created = true),
      (err: NodeJS.ErrnoException) => {
        if (err.code !== 'EEXIST') throw err;
      },
    );
  } finally {
    await fsp.rm(tmp, { force: true });
  }
  if (created) {
    await fsyncPath(dir);
    return manifest;
  }
  const existing = await readManifestObject(dir);
  if (!existing) throw refuse('invalid_checkpoint_state', `${target} exists but is not a JSON object`);
  return existing;
}

/** The manifest of a participant dir, every core field checked (§9.6 steps 1–2). */
export async function readManifest(dir: string, kind: string, instance: string, where: string): Promise<Manifest> {
  const m = await readManifestObject(dir);
  const bad = (what: string) => refuse('invalid_checkpoint_state', `manifest of ${where}: ${what}`);
  if (m === undefined) throw refuse('invalid_checkpoint_state', `no ${MANIFEST_FILE} for ${where}`);
  if (m === null) throw bad('not a JSON object');
  const version = m.schema_version instanceof LosslessNumber ? m.schema_version.valueOf() : m.schema_version;
  if (version !== SCHEMA_VERSION) throw bad(`unsupported schema_version ${describeValue(m.schema_version)}`);
  if (m.kind !== kind) throw bad(`kind ${describeValue(m.kind)} is not ${JSON.stringify(kind)}`);
  if (m.instance !== instance) throw bad(`instance ${describeValue(m.instance)} is not ${JSON.stringify(instance)}`);
  if (typeof m.checkpoint_id !== 'string') throw bad('checkpoint_id is not a string');
  if (typeof m.records_file !== 'string') throw bad('records_file is missing or not a string');
  if (!RECORDS_FILE_PATTERN.test(m.records_file)) throw bad(`records_file ${JSON.stringify(m.records_file)} is not a records file name`);
  if (!ManifestSchema.shape.records_sha256.safeParse(m.records_sha256).success) throw bad('records_sha256 is not a lowercase SHA-256 hex digest');
  const count = m.record_count;
  if (typeof count !== 'number' || !Number.isSafeInteger(count) || count < 0) throw bad('record_count is not a non-negative integer');
  return { ...m, schema_version: SCHEMA_VERSION } as Manifest;
}

/**
 * The parsed `manifest.json`: undefined when absent, null when not a JSON object. Parsed
 * losslessly: a Python writer may put anything JSON in extras.
 */
async function readManifestObject(dir: string): Promise<Record<string, unknown> | null | undefined> {
  const file = path.join(dir, MANIFEST_FILE);
  let text: string;
  try {
    text = await fsp.readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  let value: unknown;
  try {
    value = parseLossless(text);
  } catch (err) {
    throw refuse('invalid_checkpoint_state', `${file} is not JSON: ${(err as Error).message}`);
  }
  return isPlainObject(value) ? value : null;
}
