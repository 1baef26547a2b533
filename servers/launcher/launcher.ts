// Starts, stops, crashes and restarts a Gym deployment as real processes: one process group per
// server, each running `servers/main.ts` on a port fixed at `up`, detached so it outlives the
// caller (the `gym` CLI exits while the servers run). The inference backend is not part of Gym:
// `kill` leaves it running and `restart` reuses it, as after a real Gym crash.
import { closeSync, mkdirSync, openSync, statSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../common/config-error.js';
import type { Endpoints } from '../common/deployment.js';
import { groupAlive, killGroup, signalGroup, stopGroup } from './group-liveness.js';
import { probeHealth, waitHealthy } from './health.js';
import { freePorts, isPortFree } from './ports.js';
import { spawnGroup } from './process-group.js';
import {
  deploymentPath,
  endpointsOf,
  endpointsPath,
  hasRunState,
  logPath,
  logTail,
  LOGS_DIR,
  readRunState,
  writeJsonAtomic,
  writeRunState,
  type RunState,
  type ServerState,
} from './run-dir.js';
import { validateDeploymentFile, type ValidatedDeployment } from './validate.js';

export { readEndpoints } from './run-dir.js';

const PROJECT_ROOT = fileURLToPath(new URL('../../', import.meta.url));
const MAIN = fileURLToPath(new URL('../main.ts', import.meta.url));

export interface LaunchOptions {
  /** Merged over process.env, for validation (GYM_CONTROL_TOKEN) and for every server process (LOG_LEVEL…). */
  env?: NodeJS.ProcessEnv;
  /** How long each stage (inference, then the rest) may take to answer /healthz; default 120 s. */
  healthTimeoutMs?: number;
  /** Progress lines; the CLI prints them. */
  log?: (line: string) => void;
}

export interface UpOptions extends LaunchOptions {
  config: string;
  runDir: string;
}

export interface RunningDeployment {
  runDir: string;
  endpoints: Endpoints;
  state: RunState;
}

export interface ServerStatus {
  name: string;
  kind: ServerState['kind'];
  url: string;
  pid: number | null;
  alive: boolean;
  healthy: boolean;
}

/** Raised when a server does not come up; carries the tail of its log. */
export class LaunchError extends Error {
  constructor(
    readonly server: string,
    message: string,
    readonly logTail: string,
  ) {
    super(`${message}\n--- last lines of ${server}'s log ---\n${logTail}`);
    this.name = 'LaunchError';
  }
}

const isInference = (s: ServerState): boolean => s.kind === 'inference';

/**
 * Validates everything, picks ports, writes the run dir and starts every server (inference
 * first), returning once all answer /healthz. On any failure everything started is stopped.
 */
export async function upDeployment(opts: UpOptions): Promise<RunningDeployment> {
  const env = { ...process.env, ...opts.env };
  const runDir = resolve(opts.runDir);
  const source = resolve(opts.config);
  const v = await validateDeploymentFile(source, env);
  if (hasRunState(runDir)) {
    const running = Object.entries(readRunState(runDir).servers).filter(([name, s]) => groupAlive(s.pid, name));
    if (running.length) throw new Error(`${runDir} has running servers (${running.map(([n]) => n).join(', ')}): run \`gym down\` first`);
  }
  const state = await assignPorts(v, source);

  mkdirSync(resolve(runDir, LOGS_DIR), { recursive: true });
  writeFileSync(deploymentPath(runDir), v.text);
  writeJsonAtomic(endpointsPath(runDir), endpointsOf(state));
  writeRunState(runDir, state);

  const names = Object.keys(state.servers);
  try {
    await launch(runDir, state, names, env, opts);
  } catch (err) {
    await stopNames(state, names, 2_000);
    throw err;
  }
  return { runDir, endpoints: endpointsOf(state), state };
}

/** Fixed ports are kept (and must be free and distinct); every port 0 gets a free one. */
async function assignPorts(v: ValidatedDeployment, source: string): Promise<RunState> {
  const entries = Object.entries(v.deployment.servers);
  const fixed = new Map<number, string>();
  for (const [name, e] of entries) {
    if (e.port === 0) continue;
    const other = fixed.get(e.port);
    if (other) throw new ConfigError(`servers.${name}.port`, `${e.port} is also the port of servers.${other}`);
    if (!(await isPortFree(e.port))) throw new ConfigError(`servers.${name}.port`, `127.0.0.1:${e.port} is busy`);
    fixed.set(e.port, name);
  }
  const picked = await freePorts(entries.filter(([, e]) => e.port === 0).length, new Set(fixed.keys()));
  const servers: RunState['servers'] = {};
  for (const [name, e] of entries) {
    const port = e.port > 0 ? e.port : picked.shift()!;
    servers[name] = {
      kind: e.kind,
      type: v.types[name]!,
      port,
      url: `http://127.0.0.1:${port}`,
      pid: null,
      started_at: null,
      log: `${LOGS_DIR}/${name}.log`,
    };
  }
  return { version: 1, source, servers };
}

/** SIGTERM every process group, SIGKILL what is left after `graceMs`. */
export async function downDeployment(runDir: string, opts: { graceMs?: number } = {}): Promise<void> {
  const state = readRunState(resolve(runDir));
  await stopNames(state, Object.keys(state.servers), opts.graceMs ?? 5_000);
}

export interface ServerSelection {
  /** Only these servers (names of the deployment); unknown names are a LaunchError. Default: every Gym server. */
  servers?: string[];
}

/** The names a selection picks: the named servers, or every one that passes `byDefault`. */
function selectServers(state: RunState, sel: ServerSelection, byDefault: (name: string, s: ServerState) => boolean): string[] {
  if (!sel.servers)
    return Object.entries(state.servers)
      .filter(([name, s]) => byDefault(name, s))
      .map(([name]) => name);
  const unknown = sel.servers.filter((n) => !state.servers[n]);
  if (unknown.length) {
    throw new LaunchError(
      unknown[0]!,
      `no server ${unknown.map((n) => `'${n}'`).join(', ')} in this deployment (it has ${Object.keys(state.servers).join(', ')})`,
      '',
    );
  }
  return [...new Set(sel.servers)];
}

/**
 * A crash: SIGKILL every Gym process group (environment, agent, model, resources), or only the
 * selected servers. The inference backend survives unless `includeInference` (or it is selected).
 * Returns the servers that were killed.
 */
export async function killDeployment(runDir: string, opts: ServerSelection & { includeInference?: boolean } = {}): Promise<string[]> {
  const state = readRunState(resolve(runDir));
  const names = selectServers(state, opts, (_, s) => opts.includeInference === true || !isInference(s));
  const victims = names.map((name) => [name, state.servers[name]!] as const).filter(([name, s]) => groupAlive(s.pid, name));
  // Environment servers first (every signal is sent before any await): an environment that
  // outlived its agent by a few milliseconds would report the episode as a failure of a peer
  // that died in the same crash, instead of simply vanishing with it.
  victims.sort(([, a], [, b]) => Number(b.kind === 'environment') - Number(a.kind === 'environment'));
  await Promise.all(victims.map(([name, s]) => killGroup(s.pid, name)));
  return victims.map(([name]) => name);
}

/**
 * Sends `signal` to the selected servers' process groups (SIGSTOP / SIGCONT freeze and thaw a
 * server, as a stalled host would). Returns the servers signalled.
 */
export function signalServers(runDir: string, opts: Required<ServerSelection>, signal: NodeJS.Signals): string[] {
  const state = readRunState(resolve(runDir));
  return selectServers(state, opts, () => false).filter((name) => signalGroup(state.servers[name]!.pid, name, signal));
}

/**
 * Fresh processes on the same ports for every Gym server, or only the selected ones (a
 * still-running one is stopped first); the inference backend only if it is not running (or it is
 * selected). Returns once all are healthy.
 */
export async function restartDeployment(runDir: string, opts: LaunchOptions & ServerSelection = {}): Promise<RunningDeployment> {
  const dir = resolve(runDir);
  const env = { ...process.env, ...opts.env };
  const state = readRunState(dir);
  // The copy must still validate (the control token comes from this caller's environment).
  await validateDeploymentFile(deploymentPath(dir), env);
  const names = selectServers(state, opts, (name, s) => !isInference(s) || !groupAlive(s.pid, name));
  await stopNames(state, names, 5_000);
  for (const name of names) {
    const s = state.servers[name]!;
    if (!(await portFreedWithin(s.port, PORT_RELEASE_MS))) throw new Error(`${name}: 127.0.0.1:${s.port} is held by another process`);
  }
  try {
    await launch(dir, state, names, env, opts);
  } catch (err) {
    await stopNames(state, names, 2_000);
    throw err;
  }
  return { runDir: dir, endpoints: endpointsOf(state), state };
}

// e2e fix: right after a SIGKILL a server's port can stay unbindable for a moment: its orphaned
// connections linger in FIN-WAIT until their peers (e.g. a controller's idle keep-alive control
// connections) close their ends. A restart waits that out instead of failing at once.
const PORT_RELEASE_MS = 10_000;

async function portFreedWithin(port: number, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  for (;;) {
    if (await isPortFree(port)) return true;
    if (Date.now() >= until) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function statusDeployment(runDir: string): Promise<ServerStatus[]> {
  const state = readRunState(resolve(runDir));
  return Promise.all(
    Object.entries(state.servers).map(async ([name, s]) => {
      const alive = groupAlive(s.pid, name);
      return { name, kind: s.kind, url: s.url, pid: s.pid, alive, healthy: alive && (await probeHealth(s.url, name)) };
    }),
  );
}

// --- starting and stopping ------------------------------------------------------------

/** Starts `names`: inference servers first (and waits for them), then the rest together. */
async function launch(runDir: string, state: RunState, names: string[], env: NodeJS.ProcessEnv, opts: LaunchOptions): Promise<void> {
  const first = names.filter((n) => isInference(state.servers[n]!));
  const rest = names.filter((n) => !isInference(state.servers[n]!));
  for (const stage of [first, rest]) {
    if (!stage.length) continue;
    const started = stage.map((name) => startServer(runDir, state, name, env));
    writeRunState(runDir, state);
    opts.log?.(`starting ${stage.join(', ')}`);
    await Promise.all(started.map((s) => s.healthy(opts.healthTimeoutMs ?? 120_000)));
  }
}

/**
 * V8 flags of every server process (its workers inherit them). `--expose-gc`: a server collects a
 * commit's garbage once its checkpoint released admission (servers/control/collect-after-release.ts).
 * `--heap-growing-percent=100`: V8 picks the heap's growth from its collection speed against the
 * allocation rate, and a server that holds thousands of parked episodes and allocates little between
 * requests got ~1.1–1.3 times its live heap, a few MB of slack that a commit's own allocation used
 * up, starting a full collection inside the checkpoint's window (GC traces in docs/performance.md).
 * At twice the live heap a collection comes once the heap doubled, and a commit seldom brings one;
 * the cost is memory. The controller's worker keeps V8's own factor (tried, not kept: the same doc).
 */
export const SERVER_V8_FLAGS: readonly string[] = ['--expose-gc', '--heap-growing-percent=100'];

function startServer(runDir: string, state: RunState, name: string, env: NodeJS.ProcessEnv): { healthy(timeoutMs: number): Promise<void> } {
  const s = state.servers[name]!;
  const log = logPath(runDir, name);
  const fd = openSync(log, 'a');
  const logStart = statSync(log).size;
  let proc;
  try {
    // `node --import tsx` is `tsx` without its wrapper process: one process per group, signals
    // reach the server directly.
    proc = spawnGroup({
      command: process.execPath,
      args: [...SERVER_V8_FLAGS, '--import', 'tsx', MAIN, '--deployment', deploymentPath(runDir), '--name', name, '--endpoints', endpointsPath(runDir)],
      env,
      cwd: PROJECT_ROOT,
      stdio: ['ignore', fd, fd],
    });
  } finally {
    closeSync(fd);
  }
  // The server must outlive the CLI that started it.
  proc.child.unref();
  s.pid = proc.pid;
  s.started_at = new Date().toISOString();
  return {
    async healthy(timeoutMs) {
      const outcome = await waitHealthy(s.url, name, { timeoutMs, exited: proc.exited });
      if (outcome === 'healthy') return;
      const why = outcome === 'exited' ? `exited (${await proc.exited}) before answering /healthz` : `did not answer ${s.url}/healthz within ${timeoutMs} ms`;
      throw new LaunchError(name, `${name} ${why}`, logTail(log, logStart));
    },
  };
}

function stopNames(state: RunState, names: string[], graceMs: number): Promise<unknown> {
  return Promise.all(names.map((name) => stopGroup(state.servers[name]!.pid, name, graceMs)));
}
