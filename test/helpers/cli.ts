// Runs a user-facing command (scripts/run.ts, worker.ts, …) as a child process, the way npm runs
// it: node with tsx for TypeScript, plain node for .mjs.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface CommandResult {
  code: number | null;
  stdout: string;
  stderr: string;
  /** From spawn to exit. */
  ms: number;
}

/** node's arguments for `script` (a path under the root) and its arguments. */
export function nodeArgs(script: string, args: string[]): string[] {
  return [...(script.endsWith('.mjs') ? [] : ['--import', 'tsx']), join(ROOT, script), ...args];
}

export function runCommand(script: string, args: string[], opts: RunOptions = {}): Promise<CommandResult> {
  return runProcess(process.execPath, nodeArgs(script, args), opts);
}

export interface RunOptions {
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
}

/** Any program from the root, stdin closed, its output collected. */
export function runProcess(command: string, args: string[], opts: RunOptions = {}): Promise<CommandResult> {
  const started = Date.now();
  const child = spawn(command, args, {
    cwd: ROOT,
    env: opts.env ?? process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: opts.timeoutMs ?? 90_000,
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr, ms: Date.now() - started }));
  });
}

/** The environment without the variables a command falls back to (so a test sees its defaults). */
export function envWithout(...names: string[]): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const n of names) delete env[n];
  return env;
}
