// Writes clients/python/rollout_checkpoint/run_config.schema.json: the JSON Schema of the run config
// (protocol/run-config.ts) that the Python client validates against and takes its defaults from, so
// a Python-started run gets the same config as `npm run run -- start`. `--check` only compares (exit
// 1 when stale); test/unit/python-client-config.test.ts fails on a stale file too.
//   npx tsx scripts/python-schema.ts [--check]
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { z } from 'zod';
import { RunConfigSchema } from '../protocol/run-config.js';

export const SCHEMA_FILE = join(fileURLToPath(new URL('..', import.meta.url)), 'clients/python/rollout_checkpoint/run_config.schema.json');

/** Our keyword for a preprocess JSON Schema cannot state: a string `s` stands for `{ [key]: s }`. */
export const STRING_SHORTHAND = 'x-string-shorthand';

type Def = { type: string; in?: { _zod: { def: Def } }; transform?: (v: unknown, ctx: unknown) => unknown; defaultValue?: unknown };

/**
 * The key `k` of a preprocess that turns a string `s` into `{ k: s }` and passes anything else
 * through (`trainer: none`). Any other preprocess throws: the Python client would not know it.
 */
export function stringShorthandKey(transform: (v: unknown, ctx: unknown) => unknown, path: string): string {
  const ctx = { issues: [], addIssue() {} };
  const object = { kind: 'x' };
  const out = transform('probe', ctx);
  const keys = out && Object.getPrototypeOf(out) === Object.prototype ? Object.keys(out) : [];
  if (keys.length === 1 && (out as Record<string, unknown>)[keys[0]!] === 'probe' && transform(object, ctx) === object && transform(7, ctx) === 7) {
    return keys[0]!;
  }
  throw new Error(
    `run config schema: the preprocess at ${path || '(root)'} is not a string shorthand; teach scripts/python-schema.ts and clients/python about it`,
  );
}

/** The run config's JSON Schema as the Python client reads it. */
export function runConfigJsonSchema(): Record<string, unknown> {
  return z.toJSONSchema(RunConfigSchema, {
    target: 'draft-2020-12',
    // What a user writes (defaults are optional keys), not what a parse returns.
    io: 'input',
    override: ({ zodSchema, jsonSchema, path }) => {
      const def = (zodSchema as unknown as { _zod: { def: Def } })._zod.def;
      if (def.type === 'pipe' && def.in?._zod.def.type === 'transform') {
        jsonSchema[STRING_SHORTHAND] = stringShorthandKey(def.in._zod.def.transform!, path.join('.'));
      }
      // zod leaves out the default of a schema with a transform inside (`trainer`) on the input side;
      // a parse applies it all the same.
      if (def.type === 'default' && !('default' in jsonSchema)) jsonSchema.default = JSON.parse(JSON.stringify(def.defaultValue));
    },
  }) as Record<string, unknown>;
}

export function runConfigJsonSchemaText(): string {
  return `${JSON.stringify(runConfigJsonSchema(), null, 2)}\n`;
}

/** Whether the checked-in file is the schema of the current run config, byte for byte (key order included: it is the order of the defaults Python fills in). */
export function schemaFileIsCurrent(): boolean {
  try {
    return readFileSync(SCHEMA_FILE, 'utf8') === runConfigJsonSchemaText();
  } catch {
    return false;
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  if (process.argv.includes('--check')) {
    if (!schemaFileIsCurrent()) {
      console.error(`python-schema: ${SCHEMA_FILE} is stale: run npx tsx scripts/python-schema.ts`);
      process.exit(1);
    }
  } else {
    writeFileSync(SCHEMA_FILE, runConfigJsonSchemaText());
    console.error(`python-schema: wrote ${SCHEMA_FILE}`);
  }
}
