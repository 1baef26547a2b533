// The worker processes of a multi-worker server (docs/multi-worker.md): the same server program
// started N times with `--worker i --socket PATH --instance-id ID`, in the front's process group (a group kill stops
// them all), each serving on its own Unix socket in a private runtime directory. A worker exits
// when the front goes away (its IPC channel closes); the front exits when any worker does, so the
// server lives and dies as one process would.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';

export interface RunningWorkers {
  /** The worker processes, in worker order (each takes handed-off connections on its IPC channel). */
  processes: ChildProcess[];
  /** Their Unix sockets, in worker order (the control calls of the front go there). */
  sockets: string[];
  /** Resolves with a description once the first worker exits (the server is then gone). */
  lost: Promise<string>;
  /** SIGKILLs every worker still running and removes the runtime directory. */
  kill(): void;
  /** A graceful stop: each worker's IPC channel closes (it exits as when the front goes); stragglers are killed after `graceMs`. */
  stop(graceMs: number): Promise<void>;
}

export interface SpawnWorkersOptions {
  workers: number;
  /** The arguments of this process (`servers/main.ts --deployment … --name … --endpoints …`). */
  args: readonly string[];
  /** The server's identity, which every worker takes as its own. */
  instanceId: string;
  readyTimeoutMs?: number;
}

const RUNTIME_ROOT = '/tmp';
const RUNTIME_PREFIX = 'ng-workers-';

export async function spawnWorkers(opts: SpawnWorkersOptions): Promise<RunningWorkers> {
  await removeAbandonedRuntimeDirs();
  // Under /tmp: AF_UNIX paths are limited to about 100 bytes.
  const dir = mkdtempSync(path.join(RUNTIME_ROOT, `${RUNTIME_PREFIX}${process.pid}-`));
  const sockets = Array.from({ length: opts.workers }, (_, i) => workerSocketPath(dir, i));
  const children: ChildProcess[] = [];
  let reportLoss!: (why: string) => void;
  const lost = new Promise<string>((resolve) => (reportLoss = resolve));
  const kill = (): void => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  const ready = sockets.map((socket, i) => {
    const child = spawn(process.execPath, [...process.execArgv, ...opts.args, '--worker', String(i), '--socket', socket, '--instance-id', opts.instanceId], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    children.push(child);
    child.once('exit', (code, signal) => reportLoss(`worker ${i} (pid ${child.pid}) exited (${code ?? signal})`));
    return new Promise<void>((resolve, reject) => {
      child.once('message', () => resolve());
      child.once('exit', (code, signal) => reject(new Error(`worker ${i} exited (${code ?? signal}) before it served`)));
    });
  });
  const timeoutMs = opts.readyTimeoutMs ?? 120_000;
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      Promise.all(ready),
      new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`the workers did not serve within ${timeoutMs} ms`)), timeoutMs))),
    ]);
  } catch (err) {
    kill();
    throw err;
  } finally {
    clearTimeout(timer);
  }
  const stop = async (graceMs: number): Promise<void> => {
    const running = children.filter((c) => c.exitCode === null && c.signalCode === null);
    const exited = running.map((c) => new Promise<void>((resolve) => c.once('exit', () => resolve())));
    for (const c of running) if (c.connected) c.disconnect();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(exited), new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs)))]);
    clearTimeout(timer);
    kill();
  };
  return { processes: children, sockets, lost, kill, stop };
}

/** The Unix socket of worker `index` in a server's runtime directory. */
export function workerSocketPath(dir: string, index: number): string {
  return path.join(dir, `w${index}.sock`);
}

/** In a worker: tell the front it serves, and go when the front goes. */
export function announceWorkerReady(): void {
  process.send?.({ ready: true });
  process.once('disconnect', () => process.exit(0));
}

/**
 * The runtime directories of killed servers (a SIGKILLed front removes nothing): one goes only when
 * its front's process is gone and none of its sockets accepts a connection (a live server in
 * another PID namespace sharing /tmp keeps its own). Nothing is removed by age.
 */
async function removeAbandonedRuntimeDirs(): Promise<void> {
  let names: string[];
  try {
    names = readdirSync(RUNTIME_ROOT).filter((n) => n.startsWith(RUNTIME_PREFIX));
  } catch {
    return;
  }
  await Promise.all(
    names.map(async (name) => {
      const pid = Number(name.slice(RUNTIME_PREFIX.length).split('-')[0]);
      if (!Number.isSafeInteger(pid) || processExists(pid)) return;
      const dir = path.join(RUNTIME_ROOT, name);
      let sockets: string[];
      try {
        sockets = readdirSync(dir).filter((f) => f.endsWith('.sock'));
      } catch {
        return;
      }
      const answering = await Promise.all(sockets.map((s) => accepts(path.join(dir, s))));
      if (!answering.some(Boolean)) rmSync(dir, { recursive: true, force: true });
    }),
  );
}

function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Whether a Unix socket accepts a connection (a timeout counts as alive). */
function accepts(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const conn = net.connect(socketPath);
    const done = (alive: boolean): void => {
      conn.destroy();
      resolve(alive);
    };
    conn.setTimeout(1_000, () => done(true));
    conn.once('connect', () => done(true));
    conn.once('error', () => done(false));
  });
}

/** The runtime directory of the server whose front is `frontPid`, if it has one. */
export function runtimeDirOf(frontPid: number): string | undefined {
  const name = readdirSync(RUNTIME_ROOT).find((n) => n.startsWith(`${RUNTIME_PREFIX}${frontPid}-`));
  return name === undefined ? undefined : path.join(RUNTIME_ROOT, name);
}

/** The process serving worker `index` of the server whose front is `frontPid` (its command line names its socket). */
export function workerPid(frontPid: number, index: number): number | undefined {
  const dir = runtimeDirOf(frontPid);
  if (dir === undefined) return undefined;
  const socket = workerSocketPath(dir, index);
  for (const p of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      if (readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').includes(socket)) return Number(p);
    } catch {
      /* gone meanwhile */
    }
  }
  return undefined;
}
