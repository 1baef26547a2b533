// The rollout worker as a process of its own (`npm run worker -- --only rollouts`), as a deployment
// with thousands of rollouts in flight runs it: the parked `/run`s and the attempt workflows there,
// the control workflows in the bench's process. Started in its own process group, its output in a
// file; stopped with SIGTERM (its parked `/run`s failed as retryable), then SIGKILL.
import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { onExit } from './cleanup.js';
import { setTimeout as sleep } from 'node:timers/promises';

const PROJECT_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

export interface RolloutWorkerProcess {
  /** Its process group, for CPU readings. */
  pid: number;
  logFile: string;
  stop(): Promise<void>;
}

export async function startRolloutWorkerProcess(opts: {
  address: string;
  taskQueue: string;
  rolloutTaskQueue: string;
  controlToken: string;
  logFile: string;
  startTimeoutMs?: number;
}): Promise<RolloutWorkerProcess> {
  const out = openSync(opts.logFile, 'a');
  const args = ['--import', 'tsx', path.join(PROJECT_ROOT, 'worker.ts'), '--only', 'rollouts', '--log-format', 'text'];
  args.push('--address', opts.address, '--task-queue', opts.taskQueue, '--rollout-task-queue', opts.rolloutTaskQueue);
  const child = spawn(process.execPath, args, {
    cwd: PROJECT_ROOT,
    env: { ...process.env, GYM_CONTROL_TOKEN: opts.controlToken },
    detached: true,
    stdio: ['ignore', out, out],
  });
  closeSync(out);
  const pid = child.pid!;
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  const stop = async (): Promise<void> => {
    if (exited) return;
    try {
      process.kill(-pid, 'SIGTERM');
    } catch {
      return;
    }
    for (let waited = 0; !exited && waited < 30_000; waited += 200) await sleep(200);
    if (!exited) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
  };
  const forget = onExit('the rollout worker process', stop);
  const deadline = Date.now() + (opts.startTimeoutMs ?? 120_000);
  while (!readFileSync(opts.logFile, 'utf8').includes('worker: polling')) {
    if (exited || Date.now() > deadline) {
      await stop();
      throw new Error(
        `the rollout worker process did not start polling (${exited ? 'it exited' : 'timed out'}); its log:\n${readFileSync(opts.logFile, 'utf8').slice(-2_000)}`,
      );
    }
    await sleep(200);
  }
  return {
    pid,
    logFile: opts.logFile,
    async stop() {
      await forget();
    },
  };
}
