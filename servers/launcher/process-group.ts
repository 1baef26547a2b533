// Child processes in their own process group, so one signal stops a server and everything it
// started (a crash test SIGKILLs the group; a clean stop sends SIGTERM and waits).
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

export interface GroupProcess {
  pid: number;
  child: ChildProcess;
  /** Resolves with the exit code (or signal name) once the process is gone. */
  exited: Promise<number | string>;
  /** Signals the whole group; ignores a group that is already gone. */
  signal(sig: NodeJS.Signals): void;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves when the leader exited. */
  stop(graceMs?: number): Promise<void>;
  kill(): Promise<void>;
}

export interface SpawnGroupOptions {
  command: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Called with each stdout/stderr line (e.g. to find a readiness line or to log). */
  onLine?: (line: string, stream: 'stdout' | 'stderr') => void;
  /** Redirect output to files instead of pipes (for servers that outlive the launcher). */
  stdio?: 'pipe' | ['ignore', number, number];
}

export function spawnGroup(opts: SpawnGroupOptions): GroupProcess {
  const child = spawn(opts.command, opts.args, {
    cwd: opts.cwd,
    env: opts.env ?? process.env,
    detached: true,
    stdio: opts.stdio ?? ['ignore', 'pipe', 'pipe'],
  });
  if (child.pid === undefined) throw new Error(`failed to start ${opts.command}`);
  const pid = child.pid;
  const exited = new Promise<number | string>((resolve) => {
    child.once('exit', (code, sig) => resolve(code ?? sig ?? 'unknown'));
    child.once('error', () => resolve('error'));
  });
  // Always drain piped output: a child whose pipe fills up blocks on its next write.
  const onLine = opts.onLine ?? ((): void => undefined);
  for (const stream of ['stdout', 'stderr'] as const) {
    const s = child[stream];
    if (s) createInterface({ input: s }).on('line', (l) => onLine(l, stream));
  }
  const signal = (sig: NodeJS.Signals): void => {
    try {
      process.kill(-pid, sig);
    } catch {
      /* group already gone */
    }
  };
  const stop = async (graceMs = 5_000): Promise<void> => {
    signal('SIGTERM');
    const t = setTimeout(() => signal('SIGKILL'), graceMs);
    await exited;
    clearTimeout(t);
    signal('SIGKILL'); // stragglers of the group
  };
  const kill = async (): Promise<void> => {
    signal('SIGKILL');
    await exited;
  };
  return { pid, child, exited, signal, stop, kill };
}

/** Waits for a line matching `pattern` (returns its match) or fails on exit/timeout. */
export function waitForLine(proc: GroupProcess, pattern: RegExp, timeoutMs = 30_000): Promise<RegExpMatchArray> {
  return new Promise((resolve, reject) => {
    const lines: string[] = [];
    const t = setTimeout(() => reject(new Error(`no line matching ${pattern} within ${timeoutMs} ms:\n${lines.slice(-20).join('\n')}`)), timeoutMs);
    const onLine = (l: string): void => {
      lines.push(l);
      const m = pattern.exec(l);
      if (m) {
        clearTimeout(t);
        resolve(m);
      }
    };
    for (const stream of ['stdout', 'stderr'] as const) {
      const s = proc.child[stream];
      if (s) createInterface({ input: s }).on('line', onLine);
    }
    void proc.exited.then((code) => {
      clearTimeout(t);
      reject(new Error(`process exited (${code}) before printing ${pattern}:\n${lines.slice(-20).join('\n')}`));
    });
  });
}
