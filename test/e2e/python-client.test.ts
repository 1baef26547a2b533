// The Python client (clients/python, `python -m rollout_checkpoint`) against a real dev server, a
// real worker process and a real Gym deployment: it starts a run with the very workflow input
// `npm run run -- start` sends, queries its status, takes a checkpoint, waits for its summary, stops
// a second run, and prints a failed run's cause chain; verbs on finished or unknown runs, and on a run
// no worker polls for, say so.
import { spawn } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client, type Connection } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTo } from '../helpers/temporal.js';
import { downDeployment, upDeployment } from '../../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { loadRunConfig } from '../../scripts/run.js';
import { freePort, startDevServer, type DevServer } from '../../scripts/temporal-dev.mjs';
import { pauseRun, resumeRun } from '../../workflows/messages.js';
import { nodeArgs, ROOT, runProcess, type CommandResult } from '../helpers/cli.js';
import { tempDir } from '../helpers/temp-dir.js';
import { waitFor } from '../helpers/wait.js';

const PYTHON = join(ROOT, '.tools/venv/bin/python');
const PY_ENV = { ...process.env, PYTHONPATH: join(ROOT, 'clients/python'), PYTHONDONTWRITEBYTECODE: '1' };
const TOKEN = 'python-client-token';
const dir = tempDir('python-client', 'file');
const taskQueue = `python-client-${Date.now()}`;
let server: DevServer;
let worker: GroupProcess | undefined;
let connection: Connection | undefined;
let client: Client;

beforeAll(async () => {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run node scripts/bootstrap.mjs (it installs clients/python/requirements.txt)`);
  server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  const gymYaml = join(dir, 'gym.yaml');
  writeFileSync(
    gymYaml,
    [
      'checkpoint: { enabled: true }',
      'servers:',
      '  policy_backend: { kind: inference }',
      '  policy_model: { kind: model, options: { backend: policy_backend, checkpoint_policy: true } }',
      '  simple_agent: { kind: agent, options: { model: policy_model, max_steps: 8 } }',
      '  counter: { kind: resources, type: counter }',
      '  counter_env: { kind: environment, options: { agent: simple_agent, resources: counter } }',
      '',
    ].join('\n'),
  );
  await upDeployment({ config: gymYaml, runDir: join(dir, 'gym'), env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' } });
  worker = spawnGroup({
    command: process.execPath,
    args: nodeArgs('worker.ts', ['--address', server.address, '--task-queue', taskQueue, '--rollout-task-queue', `${taskQueue}-run`]),
    env: { ...process.env, GYM_CONTROL_TOKEN: TOKEN },
    cwd: ROOT,
  });
  await waitForLine(worker, /worker: polling/, 240_000);
  connection = await connectTo(server);
  client = new Client({ connection });
}, 300_000);

afterAll(async () => {
  await worker?.stop(3_000);
  await connection?.close();
  await downDeployment(join(dir, 'gym')).catch(() => undefined);
  await server?.stop();
});

function runConfig(name: string, steps: number, extra: string[] = []): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    [
      `run: { name: ${name}, gym_run_dir: ${join(dir, 'gym')}, checkpoint_dir: ${join(dir, name, 'checkpoints')}, task_queue: ${taskQueue}, rollout_task_queue: ${taskQueue}-run }`,
      `grpo: { num_prompts_per_step: 1, num_generations_per_prompt: 2, max_num_steps: ${steps}, tasksets: [counter] }`,
      'rollout_checkpointing: { restore_mode: none, gym: { prepare_timeout_s: 30 } }',
      'trainer: { enabled: false }',
      'checkpointing: { enabled: false }',
      ...extra,
      '',
    ].join('\n'),
  );
  return file;
}

/** `python -m rollout_checkpoint <args> --address <the dev server>` with the venv's Python, stdin closed, not a terminal. */
function py(...args: string[]): Promise<CommandResult> {
  return runProcess(PYTHON, ['-m', 'rollout_checkpoint', ...args, '--address', server.address], { env: PY_ENV, timeoutMs: 120_000 });
}

describe('the Python client against a real server', () => {
  it('starts a run with the TS client’s input, queries it, checkpoints it and waits for its summary', async () => {
    const file = runConfig('py-run', 2);
    const start = await py('start', file);
    expect(start.code, start.stderr).toBe(0);
    expect(start.stdout).toMatch(/^started run py-run \(run id [\w-]+\)\n$/);
    const handle = client.workflow.getHandle('py-run');
    // Paused, the run cannot finish before the checkpoint (the CLIs have no pause verb: the TS client signals).
    await handle.signal(pauseRun);

    // The workflow input is byte for byte what `npm run run -- start` sends; so are summary and memo.
    const history = await handle.fetchHistory();
    const started = history.events![0]!.workflowExecutionStartedEventAttributes!;
    const payload = started.input!.payloads![0]!;
    expect(Buffer.from(payload.metadata!.encoding!).toString()).toBe('json/plain');
    expect(Buffer.from(payload.data!).toString('utf8')).toBe(JSON.stringify({ config: loadRunConfig(file) }));
    const described = await handle.describe();
    expect(described.memo).toMatchObject({ run: 'py-run' });
    expect(await described.staticSummary()).toBe('training run py-run');
    expect(await described.staticDetails()).toBe(
      `2 steps × 1 prompts × 2 generations over counter; checkpoints every — s into \`${join(dir, 'py-run', 'checkpoints')}\``,
    );

    const [again, status] = await Promise.all([py('start', file), py('status', 'py-run')]);
    expect(again.code).toBe(1);
    expect(again.stderr.trim()).toBe('rollout_checkpoint: a run named py-run is already running');
    expect(status.code, status.stderr).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({ run: 'py-run', phase: 'paused', steps: 0, checkpoints: [] });

    const checkpoint = await py('checkpoint-now', 'py-run');
    expect(checkpoint.code, checkpoint.stderr).toBe(0);
    const outcome = JSON.parse(checkpoint.stdout);
    expect(outcome).toMatchObject({ trigger: 'manual', outcome: 'completed' });
    expect(outcome.snapshotDir).toContain(join(dir, 'py-run', 'checkpoints'));

    // On a terminal (`script` gives it a pseudo-terminal; -e passes its exit code on), wait shows a
    // progress line from the status query meanwhile.
    const quote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;
    const command = [PYTHON, '-m', 'rollout_checkpoint', 'wait', 'py-run', '--address', server.address].map(quote).join(' ');
    const tty = spawn('script', ['-qec', command, '/dev/null'], { cwd: ROOT, env: PY_ENV, stdio: ['ignore', 'pipe', 'pipe'] });
    let screen = '';
    tty.stdout.on('data', (d: Buffer) => (screen += d.toString()));
    tty.stderr.on('data', (d: Buffer) => (screen += d.toString()));
    const ttyExit = new Promise<number | null>((r) => tty.once('close', r));
    try {
      await waitFor('a progress line', () => /step 0 {2}mean reward — {2}in flight 0 {2}checkpoints 1 {2}\[paused\]/.test(screen), 30_000).catch(
        (err: Error) => {
          throw new Error(`${err.message}; the terminal showed:\n${JSON.stringify(screen)}`);
        },
      );
      expect(screen).toContain('\r\x1b[2K');
      await handle.signal(resumeRun);
      expect(await ttyExit).toBe(0);
    } finally {
      tty.kill('SIGKILL');
    }
    expect(screen).toContain('"steps": 2');

    const wait = await py('wait', 'py-run');
    expect(wait.code, wait.stderr).toBe(0);
    expect(wait.stderr).toBe(''); // not a terminal: no progress line
    const summary = await handle.result();
    // The same text as `npm run run -- wait` prints.
    expect(wait.stdout).toBe(`${JSON.stringify(summary, null, 2)}\n`);
    expect(summary).toMatchObject({ steps: 2, completedRollouts: 4, failedRollouts: 0 });
    expect(summary.checkpoints.map((c: { trigger: string; outcome: string }) => [c.trigger, c.outcome])).toEqual([['manual', 'completed']]);

    const [statusAfter, checkpointAfter] = await Promise.all([py('status', 'py-run'), py('checkpoint', 'py-run')]);
    for (const r of [statusAfter, checkpointAfter]) {
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr.trim()).toBe('rollout_checkpoint: run py-run has already finished (COMPLETED)');
    }
    // A finished run's name is not started again (its attempts' IDs are taken).
    const reused = await py('start', file);
    expect(reused.code).toBe(1);
    expect(reused.stderr.trim()).toBe(
      'rollout_checkpoint: a run named py-run has already run (COMPLETED); a name is used once, as its attempts are named after it: set run.name to a new name',
    );
  }, 120_000);

  it('stop ends a run before its last step; wait prints a failed run’s cause chain; unknown runs and runs no worker takes are named', async () => {
    const [start, startFailing] = await Promise.all([
      py('start', runConfig('py-stop', 50)),
      // An override for an agent Gym discovery does not report: the run fails at setup.
      py('start', runConfig('py-fail', 1, ['rollout_recovery: { agent_target_level_overrides: { no_such_agent: prompt_group } }'])),
    ]);
    expect(start.code, start.stderr).toBe(0);
    expect(startFailing.code, startFailing.stderr).toBe(0);

    const stop = await py('stop', 'py-stop');
    expect(stop.code, stop.stderr).toBe(0);
    expect(stop.stdout).toBe('asked run py-stop to stop\n');

    // A run no worker polls for: status and checkpoint-now give up within seconds, naming its task queue.
    const orphan = await client.workflow.start('trainingRun', { workflowId: 'py-no-worker', taskQueue: 'nobody-polls-this', args: [] });
    const [wait, waitFailing, unknown, orphanStatus, orphanCheckpoint] = await Promise.all([
      py('wait', 'py-stop'),
      py('wait', 'py-fail'),
      py('wait', 'no-such-run'),
      py('status', 'py-no-worker'),
      py('checkpoint-now', 'py-no-worker'),
    ]).finally(() => orphan.terminate('python client test over'));
    for (const r of [orphanStatus, orphanCheckpoint]) {
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr.trim()).toBe(
        'rollout_checkpoint: run py-no-worker is running, but no worker answered within 10 s: is a worker (npm run worker) polling its task queue nobody-polls-this?',
      );
      expect(r.ms).toBeLessThan(20_000);
    }
    expect(wait.code, wait.stderr).toBe(0);
    expect(JSON.parse(wait.stdout).steps).toBeLessThan(50);

    expect(waitFailing.code).toBe(1);
    expect(waitFailing.stdout).toBe('');
    const lines = waitFailing.stderr.trimEnd().split('\n');
    expect(lines[0]).toBe('rollout_checkpoint: run py-fail failed:');
    expect(lines[1]).toBe('  WorkflowFailureError: Workflow execution failed');
    expect(lines[2]).toMatch(/^ {2}caused by ApplicationError \[invalid_recovery_setup\] \(non-retryable\): .*no_such_agent/);
    expect(lines).toHaveLength(3);
    expect(waitFailing.stderr).not.toMatch(/Traceback|^\s+File "/m);

    expect(unknown.code).toBe(1);
    expect(unknown.stderr.trim()).toBe('rollout_checkpoint: no run named no-such-run (namespace default)');
  }, 120_000);
});
