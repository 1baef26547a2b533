// The real parts a fault schedule runs against and breaks: a Temporal dev server on its own SQLite
// file, the controller's worker process, and a client. Gym deployments are per schedule
// (scripts/chaos/run-schedule.ts). Every crash here is a SIGKILL of a real process group.
import { setTimeout as delay } from 'node:timers/promises';
import { appendFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { freePort, startDevServer, type DevServer } from '../temporal-dev.mjs';
import { projectRoot } from '../temporal-paths.mjs';

export const CHAOS_TASK_QUEUE = 'chaos';
/** While this file is in the world's directory, the worker dies after the next signal it names (signal-kill.mjs). */
const KILL_FILE = 'signal-kill.armed';

/** What an armed worker dies right after sending: completed reports, a checkpoint's candidates request, or its release of the holds (signal-kill.mjs). */
export type KillTrigger = 'report' | 'cut' | 'release';

/** Runs `fn` after everything queued before it: crash and restart steps on one thing never interleave. */
export class Serial {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.tail.then(fn, fn);
    this.tail = next.catch(() => undefined);
    return next;
  }
}

export interface WorldOptions {
  dir: string;
  controlToken: string;
  log: (line: string) => void;
  /** How long one try to start the worker waits for it to poll (two tries); default 180 s. */
  workerStartMs?: number;
}

export class ChaosWorld {
  readonly client: Client;
  private readonly temporalSteps = new Serial();
  private readonly workerSteps = new Serial();
  /** Why the worker could not be started, if it could not: a violation of the schedule it happened in. */
  workerFailure: string | undefined;

  private constructor(
    private readonly opts: WorldOptions,
    private server: DevServer,
    private readonly port: number,
    private readonly connection: Connection,
    private worker: GroupProcess | undefined,
  ) {
    this.client = new Client({ connection });
  }

  static async start(opts: WorldOptions): Promise<ChaosWorld> {
    mkdirSync(opts.dir, { recursive: true });
    // A fresh history per command: an earlier command's run of the same seed, left open when it
    // was stopped, would refuse this one's start (the same workflow ID). Restarts keep it (below).
    for (const suffix of ['', '-shm', '-wal']) rmSync(join(opts.dir, `temporal.sqlite${suffix}`), { force: true });
    rmSync(join(opts.dir, KILL_FILE), { force: true });
    const port = await freePort();
    const server = await startDevServer({ port, headless: true, dbFile: join(opts.dir, 'temporal.sqlite') });
    const connection = await Connection.connect({ address: server.address });
    const world = new ChaosWorld(opts, server, port, connection, undefined);
    await world.startWorker();
    return world;
  }

  get address(): string {
    return this.server.address;
  }

  /** SIGKILL the dev server, wait `downMs`, start it again on the same port and database. */
  restartTemporal(downMs: number): Promise<void> {
    return this.temporalSteps.run(async () => {
      const old = this.server;
      if (old.pid !== undefined) {
        try {
          process.kill(-old.pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
      await old.exited;
      await old.stop(0);
      await delay(downMs);
      this.server = await startDevServer({ port: this.port, headless: true, dbFile: join(this.opts.dir, 'temporal.sqlite') });
    });
  }

  /** SIGKILL the worker, wait `downMs`, start a new one (it must come up even if the server is down meanwhile). */
  restartWorker(downMs: number): Promise<void> {
    return this.workerSteps.run(async () => {
      await this.worker?.kill();
      this.worker = undefined;
      await delay(downMs);
      await this.startWorkerNow();
    });
  }

  /**
   * Arms the worker to SIGKILL itself right after it next sends completed reports to a shard, a
   * checkpoint's candidates request to one, or the holds a checkpoint releases (`trigger`;
   * scripts/chaos/signal-kill.mjs), and waits for that, at most `waitMs`. Resolves whether it died
   * so (false: no such signal went out in time, and the worker was left running); `restartWorker`
   * starts the next one. A release counts once the checkpoint that sends it published its snapshot
   * in `checkpointDir` since arming. `onArmed` runs once the worker is armed (to set off what sends
   * the signal).
   */
  killAfterSignal(trigger: KillTrigger, waitMs: number, opts: { checkpointDir?: string; onArmed?: () => void } = {}): Promise<boolean> {
    return this.workerSteps.run(async () => {
      const worker = this.worker;
      if (!worker) return false;
      writeFileSync(this.killFile, [trigger, ...(opts.checkpointDir ? [opts.checkpointDir] : [])].join('\n'));
      opts.onArmed?.();
      const exited = (ms: number): Promise<boolean> => Promise.race([worker.exited.then(() => true), delay(ms).then(() => false)]);
      const died = await exited(waitMs);
      rmSync(this.killFile, { force: true });
      // It may have been dying as it was disarmed.
      if (!died && !(await exited(500))) return false;
      this.worker = undefined;
      return true;
    });
  }

  private get killFile(): string {
    return join(this.opts.dir, KILL_FILE);
  }

  startWorker(): Promise<void> {
    return this.workerSteps.run(() => this.startWorkerNow());
  }

  private spawnWorker(): GroupProcess {
    const logFile = join(this.opts.dir, 'worker.log');
    return spawnGroup({
      command: process.execPath,
      args: [
        '--import',
        'tsx',
        '--import',
        join(projectRoot, 'scripts/chaos/signal-kill.mjs'),
        join(projectRoot, 'worker.ts'),
        '--address',
        this.server.address,
        '--task-queue',
        CHAOS_TASK_QUEUE,
        '--rollout-task-queue',
        `${CHAOS_TASK_QUEUE}-run`,
      ],
      env: { ...process.env, GYM_CONTROL_TOKEN: this.opts.controlToken, CHAOS_KILL_FILE: this.killFile },
      cwd: projectRoot,
      onLine: (line) => appendFileSync(logFile, `${line}\n`),
    });
  }

  private async startWorkerNow(): Promise<void> {
    for (let tries = 0; tries < 2; tries++) {
      this.worker = this.spawnWorker();
      try {
        await waitForLine(this.worker, /worker: polling/, this.opts.workerStartMs ?? 180_000);
        return;
      } catch (err) {
        // A violation of the schedule it happened in; the next try keeps the world usable.
        this.workerFailure ??= `the worker did not start: ${(err as Error).message.split('\n').slice(0, 4).join(' | ')}`;
        // Its last lines in full: the worker's log goes with the world's directory.
        this.opts.log(`the worker did not start (try ${tries + 1} of 2): ${(err as Error).message}`);
        await this.worker.kill();
      }
    }
  }

  /** Waits for crash and restart steps still under way. */
  async settle(): Promise<void> {
    await Promise.all([this.temporalSteps.run(async () => undefined), this.workerSteps.run(async () => undefined)]);
  }

  async close(): Promise<void> {
    await this.settle();
    await this.worker?.stop(3_000);
    await this.connection.close().catch(() => undefined);
    await this.server.stop();
  }
}

export { delay };
