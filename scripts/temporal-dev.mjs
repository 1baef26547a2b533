#!/usr/bin/env node
// Our own launcher for `temporal server start-dev`: the SDK's launcher gives a cold server only
// 5 s to answer and cannot persist to a file we choose, tune SQLite or keep the server running.
// Importable (startDevServer, freePort) and runnable: `node scripts/temporal-dev.mjs [--port N]
// [--ui-port N] [--db FILE | --in-memory] [--headless] [--namespace NS] [--log-level L]` (DEV_CLI).
import { spawn } from 'node:child_process';
import { closeSync, fstatSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import { connect as tcpConnect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as delay } from 'node:timers/promises';
import { Connection } from '@temporalio/client';
import { defineCommand, exitWithUsageError, parseCommandLine } from './cli.mjs';
import { INDEXED_VALUE_TYPE, SEARCH_ATTRIBUTES } from '../protocol/search-attributes.mjs';
import { ensureSearchAttributes } from './search-attributes.mjs';
import { projectRoot, readTemporalPaths } from './temporal-paths.mjs';

/** The search attributes the controller's workflows set (protocol/search-attributes.mjs). */
export const DEFAULT_SEARCH_ATTRIBUTES = SEARCH_ATTRIBUTES;

// Temporal's limits stay at their defaults (2,000 pending children or activities per workflow,
// 10,000 signals per execution, 2 MiB payloads), as on a user's cluster or Temporal Cloud: the
// controller is designed for them. What is here only stands in for what a production cluster has
// for free on its many history shards (docs/performance.md).
export const DEFAULT_DYNAMIC_CONFIG = Object.freeze({
  'frontend.enableServerVersionCheck': false,
  // The dev server has one history shard, so one transfer-queue reader carries every task the
  // server hands on (workflow and activity tasks after a completion, child starts, signals to
  // other workflows). It reads at most 20 times a second by default: after a short burst every
  // hand-off waits for the next 50 ms slot, so a workflow's next task started >= 40 ms after its
  // last one, whatever the work. A production cluster spreads this over many shards.
  'history.transferProcessorMaxPollRPS': 1000,
  'history.timerProcessorMaxPollRPS': 1000,
  'history.visibilityProcessorMaxPollRPS': 1000,
  // A hot workflow (every rollout's start, report and close touches its parent): with this on,
  // tasks that find it locked wait in a queue of its own instead of failing BUSY_WORKFLOW and
  // backing off. A production cluster schedules per shard across many.
  'history.taskSchedulerEnableExecutionQueueScheduler': true,
  // The CLI's dev server shrinks the history service's cache of workflow states to 8,096 entries;
  // Temporal's own default, what a cluster runs with, is 128,000 per history host. With more
  // workflows than that busy at once (16,000 parked rollouts whose `/run`s all return together)
  // every entry is pinned, the server refuses calls ("cache capacity is fully occupied with pinned
  // elements") and activities time out; below that, misses reload workflow states from SQLite.
  'history.hostLevelCacheMaxSize': 128000,
});

// temporal.api.enums.v1.IndexedValueType, for registering attributes the server lacks.

/** Servers started by this process and not handed over with keepRunning(): killed on exit. */
const live = new Set();
let exitHookInstalled = false;

function killGroup(pid, signal) {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false; // already gone
  }
}

/** A port on 127.0.0.1 that was free a moment ago. */
export function freePort() {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {import('node:net').AddressInfo} */ (srv.address());
      srv.close(() => resolvePort(port));
    });
  });
}

/** Whether nothing listens on 127.0.0.1:port (the CLI refuses a busy port only after a while). */
export function isPortFree(port) {
  return new Promise((resolveFree) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', () => resolveFree(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolveFree(true)));
  });
}

function tcpAnswers(port) {
  return new Promise((resolveOpen) => {
    const sock = tcpConnect({ host: '127.0.0.1', port });
    sock.once('connect', () => {
      sock.destroy();
      resolveOpen(true);
    });
    sock.once('error', () => resolveOpen(false));
  });
}

function readTail(file, maxChars = 4000) {
  try {
    return readFileSync(file, 'utf8').slice(-maxChars).trim();
  } catch {
    return '';
  }
}

/** What the file holds from byte offset on (this start's part of an appended log). */
function readFrom(file, offset) {
  try {
    return readFileSync(file).subarray(offset).toString('utf8');
  } catch {
    return '';
  }
}

/** One gRPC round trip: connect, then the namespace must exist. Returns the open connection. */
async function tryConnect(address, namespace) {
  const connection = Connection.lazy({ address, connectTimeout: '2s' });
  try {
    await connection.ensureConnected();
    await connection.workflowService.describeNamespace({ namespace });
    return connection;
  } catch (err) {
    await connection.close().catch(() => {});
    throw err;
  }
}

/**
 * Spawns `temporal server start-dev` in its own process group and waits until it serves.
 * @param {import('./temporal-dev.d.mts').DevServerOptions} [options]
 * @returns {Promise<import('./temporal-dev.d.mts').DevServer>}
 */
export async function startDevServer(options = {}) {
  // The CLI picks its HTTP API, metrics and internal service ports itself, from ports free at
  // that moment, before anything binds: a pick can land on a port taken a moment later (ours
  // included, when a server restarts on its old port). Such a start fails with "address already
  // in use"; a new start picks again.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startDevServerOnce(options);
    } catch (err) {
      if (!(err instanceof PortRaceError) || attempt >= 3) throw err;
      process.emitWarning(`temporal server start-dev lost a port race, starting again (attempt ${attempt + 1})`);
    }
  }
}

/** A start that failed because a port the CLI picked for itself was taken before it bound it. */
class PortRaceError extends Error {}

async function startDevServerOnce(options) {
  const {
    port = 7233,
    uiPort = 8233,
    headless = false,
    namespace = 'default',
    searchAttributes = DEFAULT_SEARCH_ATTRIBUTES,
    extraDynamicConfig = {},
    logLevel = 'warn',
    readyTimeoutMs = 60_000,
    output = 'file',
  } = options;
  const dbFile = options.dbFile === null ? null : resolve(projectRoot, options.dbFile ?? '.data/temporal.sqlite');
  const logFile = resolve(options.logFile ?? (dbFile ? `${dbFile}.log` : join(tmpdir(), `temporal-dev-${port}.log`)));
  const cli = options.cliPath ?? readTemporalPaths().cli.path;

  for (const type of Object.values(searchAttributes)) {
    if (!(type in INDEXED_VALUE_TYPE)) throw new Error(`unknown search attribute type ${type}`);
  }
  for (const [what, p] of [['gRPC', port], ...(headless ? [] : [['UI', uiPort]])]) {
    if (!(await isPortFree(p))) {
      throw new Error(`${what} port 127.0.0.1:${p} is busy (another Temporal dev server? \`npm run demo -- --keep\` leaves one running)`);
    }
  }

  // Our own pick for the HTTP API, never the gRPC or UI port (the CLI's random pick can be either
  // when they are not bound yet, e.g. a restart on the old port).
  let httpPort;
  do httpPort = await freePort();
  while (httpPort === port || httpPort === uiPort);
  const args = ['server', 'start-dev', '--ip', '127.0.0.1', '--port', String(port), '--http-port', String(httpPort), '--log-level', logLevel];
  if (headless) args.push('--headless');
  else args.push('--ui-port', String(uiPort), '--ui-disable-news-fetch');
  if (namespace !== 'default') args.push('--namespace', namespace);
  if (dbFile) {
    mkdirSync(dirname(dbFile), { recursive: true });
    args.push('--db-filename', dbFile, '--sqlite-pragma', 'journal_mode=WAL', '--sqlite-pragma', 'synchronous=NORMAL');
    // A 128 MiB page cache (the default is 2 MiB) and temporary tables in memory.
    args.push('--sqlite-pragma', 'cache_size=-131072', '--sqlite-pragma', 'temp_store=MEMORY');
  }
  // Values are JSON: numbers and booleans bare, strings quoted.
  for (const [key, value] of Object.entries({ ...DEFAULT_DYNAMIC_CONFIG, ...extraDynamicConfig })) {
    args.push('--dynamic-config-value', `${key}=${JSON.stringify(value)}`);
  }
  for (const [name, type] of Object.entries(searchAttributes)) args.push('--search-attribute', `${name}=${type}`);

  // Output goes to a file, not a pipe: a server left running (keepRunning) must outlive us.
  let fd;
  let logStart = 0;
  if (output === 'file') {
    mkdirSync(dirname(logFile), { recursive: true });
    fd = openSync(logFile, 'a');
    logStart = fstatSync(fd).size;
  }
  const child = spawn(cli, args, {
    cwd: projectRoot,
    detached: true, // own process group: stop() takes down everything it started
    stdio: ['ignore', fd ?? 'inherit', fd ?? 'inherit'],
    env: { ...process.env, TEMPORAL_VERSION_CHECK_DISABLED: '1' },
  });
  if (fd !== undefined) closeSync(fd);
  // A forgotten server must not keep the process alive; the exit hook below kills it instead.
  child.unref();

  let exitInfo;
  const exited = new Promise((resolveExit) => {
    child.once('exit', (code, signal) => resolveExit((exitInfo = { code, signal })));
    child.once('error', (err) => resolveExit((exitInfo = { code: null, signal: null, error: err })));
  });
  const pid = child.pid;
  const address = `127.0.0.1:${port}`;

  let stopping;
  const server = {
    address,
    namespace,
    uiUrl: headless ? undefined : `http://127.0.0.1:${uiPort}`,
    pid,
    logFile: output === 'file' ? logFile : undefined,
    dbFile,
    exited,
    stop(timeoutMs = 10_000) {
      stopping ??= (async () => {
        live.delete(server);
        if (exitInfo || pid === undefined) return;
        killGroup(pid, 'SIGTERM');
        let timer;
        const graceful = await Promise.race([exited.then(() => true), new Promise((r) => (timer = setTimeout(() => r(false), timeoutMs)))]);
        clearTimeout(timer);
        if (!graceful) {
          killGroup(pid, 'SIGKILL');
          await exited;
        }
      })();
      return stopping;
    },
    keepRunning() {
      live.delete(server);
    },
  };
  if (pid !== undefined) live.add(server);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    const killLive = () => {
      for (const s of live) if (s.pid !== undefined) killGroup(s.pid, 'SIGKILL');
    };
    process.on('exit', killLive);
    // A signal's default action skips 'exit' hooks: kill our servers, then die of the same signal.
    // When the host handles the signal itself, leave it to the host (and to the exit hook).
    const onSignal = (sig) => {
      if (process.listenerCount(sig) > 1) return;
      killLive();
      process.removeListener(sig, onSignal);
      process.kill(process.pid, sig);
    };
    for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, onSignal);
  }

  const deadline = Date.now() + readyTimeoutMs;
  let lastError;
  try {
    while (true) {
      if (exitInfo) {
        const why = exitInfo.error ? exitInfo.error.message : `exit ${exitInfo.code ?? exitInfo.signal}`;
        throw new Error(`temporal server start-dev ended before serving (${why})`);
      }
      if (Date.now() > deadline) {
        throw new Error(`temporal server start-dev did not answer on ${address} within ${readyTimeoutMs} ms (${lastError?.message ?? 'no answer'})`);
      }
      if (await tcpAnswers(port)) {
        try {
          const connection = await tryConnect(address, namespace);
          try {
            // `--search-attribute` applies only when the namespace is created: a database from an
            // older run lacks newer attributes.
            await ensureSearchAttributes(connection, namespace, searchAttributes);
          } finally {
            await connection.close();
          }
          return server;
        } catch (err) {
          lastError = err;
        }
      }
      await delay(100);
    }
  } catch (err) {
    await server.stop();
    const log = server.logFile ? readTail(server.logFile) : '';
    const ownLog = server.logFile ? readFrom(server.logFile, logStart) : '';
    const raced = exitInfo && /bind: address already in use/.test(ownLog) && (await isPortFree(port));
    throw new (raced ? PortRaceError : Error)(
      `${err.message}\ncommand: ${cli} ${args.join(' ')}${log ? `\nlast server output (${server.logFile}):\n${log}` : ''}`,
    );
  }
}

const DEV_CLI = defineCommand({
  name: 'temporal-dev',
  invocation: 'npm run temporal-dev',
  usage: ['npm run temporal-dev -- [--port N] [--ui-port N] [--db FILE | --in-memory] [--headless] [--namespace NS] [--log-level LEVEL]'],
  summary:
    'Runs a Temporal dev server (`temporal server start-dev`) in the foreground until Ctrl-C, with polling rates raised for one history shard ' +
    '(docs/performance.md), the search attributes the controller uses, and SQLite tuned. Listens on 127.0.0.1 only.',
  flags: {
    port: { type: 'string', value: 'N', help: 'the gRPC port (default: 7233)' },
    'ui-port': { type: 'string', value: 'N', help: 'the Web UI port (default: 8233)' },
    db: { type: 'string', value: 'FILE', help: 'the SQLite database, relative to the project root (default: .data/temporal.sqlite)' },
    'in-memory': { type: 'boolean', help: 'no database file: everything is lost when the server stops' },
    headless: { type: 'boolean', help: 'no Web UI' },
    namespace: { type: 'string', value: 'NS', help: 'a namespace to create besides default, and wait for' },
    'log-level': { type: 'string', value: 'LEVEL', help: "the server's log level: debug, info, warn, error or never (default: warn)" },
  },
  env: [],
  noEnv:
    'None read by this script. The temporal CLI it starts is the one scripts/bootstrap.mjs resolved (.tools/temporal.json), run with this environment plus TEMPORAL_VERSION_CHECK_DISABLED=1.',
});

function parseCliArgs(argv) {
  const { values } = parseCommandLine(DEV_CLI, argv);
  const port = (flag) => {
    const v = values[flag];
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1 || n > 65535) exitWithUsageError(DEV_CLI, `--${flag} must be a port number (1-65535), got '${v}'`);
    return n;
  };
  const levels = ['debug', 'info', 'warn', 'error', 'never'];
  if (values['log-level'] !== undefined && !levels.includes(values['log-level'])) {
    exitWithUsageError(DEV_CLI, `--log-level must be one of ${levels.join(', ')}, got '${values['log-level']}'`);
  }
  if (values.db !== undefined && values['in-memory']) exitWithUsageError(DEV_CLI, 'give --db or --in-memory, not both');
  const opts = { output: 'inherit' };
  if (values.port !== undefined) opts.port = port('port');
  if (values['ui-port'] !== undefined) opts.uiPort = port('ui-port');
  if (values.db !== undefined) opts.dbFile = values.db;
  if (values['in-memory']) opts.dbFile = null;
  if (values.headless) opts.headless = true;
  if (values.namespace !== undefined) opts.namespace = values.namespace;
  if (values['log-level'] !== undefined) opts.logLevel = values['log-level'];
  return opts;
}

async function main() {
  const server = await startDevServer(parseCliArgs(process.argv.slice(2)));
  console.log(`Temporal dev server (pid ${server.pid}) on ${server.address}, namespace ${server.namespace}`);
  console.log(server.uiUrl ? `Web UI: ${server.uiUrl}` : 'Web UI: off (--headless)');
  console.log(server.dbFile ? `Database: ${server.dbFile}` : 'Database: in memory');
  console.log('Ctrl-C stops it.');
  let stopping = false;
  const onSignal = async (sig) => {
    stopping = true;
    console.log(`\n${sig}: stopping the dev server...`);
    await server.stop();
    console.log('stopped');
    process.exit(0);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  // Keep the process alive while the server runs (its child handle is unref'd).
  const keepAlive = setInterval(() => {}, 1 << 30);
  const { code, signal } = await server.exited;
  if (stopping) return; // onSignal exits once stop() has finished
  clearInterval(keepAlive);
  console.error(`temporal server start-dev exited on its own (${code ?? signal})`);
  process.exit(code || 1);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((err) => {
    console.error(err.message ?? err);
    process.exit(1);
  });
}
