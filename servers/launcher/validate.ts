// Validates a whole deployment before anything starts: the file, the `checkpoint:` block (token
// from GYM_CONTROL_TOKEN), and every server's options against its module's schema, so a typo
// fails naming its key (`servers.weather.options.checkpoint_mode`) and no process is left behind.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { ConfigError, parseConfig } from '../common/config-error.js';
import { parseDeployment, type Deployment } from '../common/deployment.js';
import { loadServerModule, serverTypeOf } from '../registry.js';

export interface ValidatedDeployment {
  /** The file's text, copied verbatim into the run dir. */
  text: string;
  deployment: Deployment;
  /** Each server's options with defaults filled in. */
  options: Record<string, unknown>;
  /** Each server's type (defaults resolved). */
  types: Record<string, string>;
}

export async function validateDeploymentText(text: string, env: NodeJS.ProcessEnv, source = 'deployment'): Promise<ValidatedDeployment> {
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new ConfigError(source, `not valid YAML: ${(err as Error).message}`);
  }
  const deployment = parseDeployment(raw, env);
  const options: Record<string, unknown> = {};
  const types: Record<string, string> = {};
  for (const [name, entry] of Object.entries(deployment.servers)) {
    const mod = await loadServerModule(name, entry);
    options[name] = parseConfig(mod.optionsSchema, entry.options, `servers.${name}.options`);
    if (entry.workers > 1 && mod.singleProcess)
      throw new ConfigError(`servers.${name}.workers`, `a ${serverTypeOf(entry)} server runs as one process: ${mod.singleProcess}`);
    types[name] = serverTypeOf(entry);
  }
  return { text, deployment, options, types };
}

export async function validateDeploymentFile(file: string, env: NodeJS.ProcessEnv): Promise<ValidatedDeployment> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(file, `cannot read deployment file: ${(err as Error).message}`);
  }
  return validateDeploymentText(text, env, file);
}
