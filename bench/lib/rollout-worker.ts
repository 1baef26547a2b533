// The rollout worker as a process of its own (`npm run worker -- --only rollouts`), as a deployment
// with thousands of rollouts in flight runs it: the parked `/run`s and the attempt workflows there,
// the control workflows in the bench's process. Started in its own process group (the launcher's
// spawnGroup), its output in a file; stopped with SIGTERM (its parked `/run`s failed as
// retryable), then SIGKILL.
import { createWriteStream } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnGroup, waitForLine } from '../../servers/launcher/process-group.js';
import { onExit } from './cleanup.js';

const PROJECT_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

export interface RolloutWorkerProcess {
  /** Its process group, for CPU readings. */
  pid: number;
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
  const log = createWriteStream(opts.logFile, { flags: 'a' });
  const proc = spawnGroup({
    command: process.execPath,
    args: [
      ...['--import', 'tsx', path.join(PROJECT_ROOT, 'worker.ts'), '--only', 'rollouts', '--log-format', 'text'],
      ...['--address', opts.address, '--task-queue', opts.taskQueue, '--rollout-task-queue', opts.rolloutTaskQueue],
    ],
    env: { ...process.env, GYM_CONTROL_TOKEN: opts.controlToken },
    cwd: PROJECT_ROOT,
    onLine: (line) => log.write(`${line}\n`),
  });
  void proc.exited.then(() => log.end());
  const stop = onExit('the rollout worker process', () => proc.stop(30_000));
  try {
    await waitForLine(proc, /worker: polling/, opts.startTimeoutMs ?? 120_000);
  } catch (err) {
    await stop();
    throw new Error(`the rollout worker process did not start polling: ${(err as Error).message}`);
  }
  return { pid: proc.pid, stop };
}
