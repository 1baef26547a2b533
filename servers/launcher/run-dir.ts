// The files of one launched deployment (`<run dir>/`): endpoints.json (every server's URL, read by
// each server process), deployment.yaml (the copy every process reads, so editing the source file
// does not change a running deployment), state.json (process groups and ports) and logs/<name>.log.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { ConfigError, parseConfig } from '../common/config-error.js';
import { EndpointsSchema, SERVER_KINDS, type Endpoints } from '../common/deployment.js';

export const ENDPOINTS_FILE = 'endpoints.json';
export const DEPLOYMENT_FILE = 'deployment.yaml';
export const STATE_FILE = 'state.json';
export const LOGS_DIR = 'logs';

export const ServerStateSchema = z.strictObject({
  kind: z.enum(SERVER_KINDS),
  type: z.string(),
  port: z.number().int().min(1).max(65535),
  url: z.string(),
  /** Process ID of the group leader, which is also the process group ID; null before the first start. */
  pid: z.number().int().positive().nullable(),
  started_at: z.string().nullable(),
  /** Relative to the run dir. */
  log: z.string(),
});
export type ServerState = z.infer<typeof ServerStateSchema>;

export const RunStateSchema = z.strictObject({
  version: z.literal(1),
  /** The deployment file `up` was given (absolute). */
  source: z.string(),
  servers: z.record(z.string(), ServerStateSchema),
});
export type RunState = z.infer<typeof RunStateSchema>;

export const endpointsPath = (runDir: string): string => join(runDir, ENDPOINTS_FILE);
export const deploymentPath = (runDir: string): string => join(runDir, DEPLOYMENT_FILE);
export const statePath = (runDir: string): string => join(runDir, STATE_FILE);
export const logPath = (runDir: string, name: string): string => join(runDir, LOGS_DIR, `${name}.log`);

/** The last `lines` lines of a server's log from byte `from` on; '(empty)' or '(no log)' when there are none. */
export function logTail(file: string, from = 0, lines = 40): string {
  try {
    const text = readFileSync(file).subarray(from).toString('utf8');
    return (
      text
        .split('\n')
        .slice(-lines - 1)
        .join('\n')
        .trimEnd() || '(empty)'
    );
  } catch {
    return '(no log)';
  }
}

/** Write-then-rename, so a reader (or a crash) never sees half a file. */
export function writeJsonAtomic(file: string, value: unknown): void {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(value, null, 2)}\n`);
  renameSync(tmp, file);
}

function readJson(file: string): unknown {
  if (!existsSync(file)) throw new ConfigError(file, 'missing: is this the run dir of `gym up`?');
  try {
    return JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(file, `not valid JSON: ${(err as Error).message}`);
  }
}

export function readEndpoints(runDir: string): Endpoints {
  return parseConfig(EndpointsSchema, readJson(endpointsPath(runDir)), 'endpoints');
}

export function hasRunState(runDir: string): boolean {
  return existsSync(statePath(runDir));
}

export function readRunState(runDir: string): RunState {
  return parseConfig(RunStateSchema, readJson(statePath(runDir)), 'state');
}

export function writeRunState(runDir: string, state: RunState): void {
  writeJsonAtomic(statePath(runDir), state);
}

export function endpointsOf(state: RunState): Endpoints {
  return Object.fromEntries(Object.entries(state.servers).map(([name, s]) => [name, { kind: s.kind, url: s.url }]));
}
