// A Gym deployment described by one YAML file: the global `checkpoint:` block and one entry per
// server (kind, type, port, options). The launcher validates the whole file before it starts
// anything; each server process reads its own entry back from the same file.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { ID_PATTERN } from '../../protocol/ids.js';
import { CheckpointBlockSchema, type CheckpointBlock } from '../control/config.js';
import { ConfigError, parseConfig } from './config-error.js';

export const SERVER_KINDS = ['environment', 'agent', 'model', 'resources', 'inference'] as const;
export type ServerKind = (typeof SERVER_KINDS)[number];

export const ServerEntrySchema = z.strictObject({
  kind: z.enum(SERVER_KINDS),
  /** Which implementation of the kind (e.g. resources `weather`, `counter`, `genrm_compare`). */
  type: z.string().optional(),
  /** 0 or absent: the launcher picks a free port once and keeps it across restarts. */
  port: z.number().int().min(0).max(65535).default(0),
  options: z.record(z.string(), z.unknown()).default({}),
  /** Processes behind the server's one URL, one participant to the controller (docs/multi-worker.md). */
  workers: z.number().int().min(1).max(64).default(1),
});
export type ServerEntry = z.infer<typeof ServerEntrySchema>;

export const DeploymentSchema = z.strictObject({
  checkpoint: CheckpointBlockSchema.default({ enabled: false, control_auth_token: null, lease_grace_seconds: 600 }),
  /** Signs session cookies; stable across restarts so a restored handle's cookie stays valid. */
  session_secret: z.string().min(16).optional(),
  servers: z
    .record(z.string().regex(ID_PATTERN, 'server names must match ^[A-Za-z0-9][A-Za-z0-9._-]*$'), ServerEntrySchema)
    .refine((s) => Object.keys(s).length > 0, 'at least one server is required')
    .superRefine((servers, ctx) => {
      for (const [name, entry] of Object.entries(servers)) {
        // An inference backend's generation cuts must reach the process running the generation.
        if (entry.kind === 'inference' && entry.workers > 1)
          ctx.addIssue({ code: 'custom', path: [name, 'workers'], message: 'an inference server runs as one process' });
      }
    }),
});
export type Deployment = z.infer<typeof DeploymentSchema> & { checkpoint: CheckpointBlock };

export const CONTROL_TOKEN_ENV = 'GYM_CONTROL_TOKEN';
export const SESSION_SECRET_ENV = 'GYM_SESSION_SECRET';
const DEFAULT_SESSION_SECRET = 'rollout-checkpoint-dev-session-secret';

/**
 * Parses and validates a deployment. The control token comes from `GYM_CONTROL_TOKEN` when the
 * file does not set one (tokens do not belong in files that get committed).
 */
export function parseDeployment(raw: unknown, env: NodeJS.ProcessEnv = process.env): Deployment {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new ConfigError('(root)', 'a deployment file must be a YAML mapping');
  const withToken = structuredClone(raw) as Record<string, unknown>;
  const block = withToken.checkpoint;
  if (block && typeof block === 'object' && !Array.isArray(block)) {
    const b = block as Record<string, unknown>;
    if ((b.control_auth_token === undefined || b.control_auth_token === null) && env[CONTROL_TOKEN_ENV]) {
      b.control_auth_token = env[CONTROL_TOKEN_ENV];
    }
  }
  const dep = parseConfig(DeploymentSchema, withToken, '') as Deployment;
  if (dep.checkpoint.enabled && !dep.checkpoint.control_auth_token) {
    throw new ConfigError('checkpoint.control_auth_token', `required when checkpoint.enabled is true (set ${CONTROL_TOKEN_ENV})`);
  }
  return dep;
}

export function loadDeployment(file: string, env: NodeJS.ProcessEnv = process.env): Deployment {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(file, `cannot read deployment file: ${(err as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new ConfigError(file, `not valid YAML: ${(err as Error).message}`);
  }
  return parseDeployment(raw, env);
}

export function sessionSecretOf(dep: Deployment, env: NodeJS.ProcessEnv = process.env): string {
  return dep.session_secret ?? env[SESSION_SECRET_ENV] ?? DEFAULT_SESSION_SECRET;
}

/** Where each server listens, written by the launcher as `<run dir>/endpoints.json`. */
export const EndpointsSchema = z.record(z.string(), z.strictObject({ kind: z.enum(SERVER_KINDS), url: z.string().url() }));
export type Endpoints = z.infer<typeof EndpointsSchema>;
