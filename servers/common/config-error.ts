// Configuration errors name the key that is wrong (`servers.weather.options.checkpoint_mode`),
// so a typo fails startup with a message a user can act on.
import type { z } from 'zod';

export class ConfigError extends Error {
  constructor(
    readonly key: string,
    message: string,
  ) {
    super(`${key}: ${message}`);
    this.name = 'ConfigError';
  }
}

/** Parses `value` with `schema`; the first issue becomes a ConfigError naming `prefix.<path>`. */
export function parseConfig<S extends z.ZodType>(schema: S, value: unknown, prefix: string): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = [prefix, ...issue.path.map(String)].filter(Boolean).join('.');
  const keys = (issue as { keys?: string[] }).keys;
  if (issue.code === 'unrecognized_keys' && keys?.length) {
    return fail(`${path ? `${path}.` : ''}${keys[0]}`, `unknown key (allowed keys are listed in the docs of ${path || 'the file'})`);
  }
  return fail(path || '(root)', issue.message);
}

function fail(key: string, message: string): never {
  throw new ConfigError(key, message);
}
