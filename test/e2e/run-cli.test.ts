// `npm run run` against a real dev server, a real worker process and a real Gym model server:
// a run the Gym refuses (the worker has the wrong control token → 401 `unauthorized`) makes `wait`
// print the cause chain with the typed code; verbs on a finished or unknown run say so; on a
// terminal `wait` shows a progress line from the status query, and a terminated run says so; a
// query or update no worker takes fails in seconds naming the run's task queue.
import { spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { Client, type Connection } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectTo } from '../helpers/temporal.js';
import { downDeployment, upDeployment } from '../../servers/launcher/launcher.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';
import { freePort, startDevServer, type DevServer } from '../../scripts/temporal-dev.mjs';
import { nodeArgs, ROOT, runCommand } from '../helpers/cli.js';
import { tempDir } from '../helpers/temp-dir.js';
import { waitFor } from '../helpers/wait.js';

const dir = tempDir('run-cli', 'file');
const taskQueue = `run-cli-${Date.now()}`;
let server: DevServer;
let worker: GroupProcess | undefined;
let connection: Connection | undefined;
let silent: Server | undefined;
const sockets = new Set<Socket>();

beforeAll(async () => {
  server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite') });
  // A Gym whose model server is a checkpoint participant, with a token the worker does not have.
  const gymYaml = join(dir, 'gym.yaml');
  writeFileSync(
    gymYaml,
    'checkpoint: { enabled: true }\nservers:\n  policy_backend: { kind: inference }\n  policy_model: { kind: model, options: { backend: policy_backend, checkpoint_policy: true } }\n',
  );
  await upDeployment({ config: gymYaml, runDir: join(dir, 'gym'), env: { GYM_CONTROL_TOKEN: 'the-gym-token', LOG_LEVEL: 'warn' } });
  // A Gym that accepts connections and never answers: discovery waits, the run stays running.
  silent = createServer((s) => sockets.add(s));
  await new Promise<void>((r) => silent!.listen(0, '127.0.0.1', r));
  const port = (silent.address() as { port: number }).port;
  mkdirSync(join(dir, 'silent-gym'));
  writeFileSync(join(dir, 'silent-gym', 'endpoints.json'), JSON.stringify({ silent_env: { kind: 'environment', url: `http://127.0.0.1:${port}` } }));

  worker = spawnGroup({
    command: process.execPath,
    args: nodeArgs('worker.ts', ['--address', server.address, '--task-queue', taskQueue, '--rollout-task-queue', `${taskQueue}-run`]),
    env: { ...process.env, GYM_CONTROL_TOKEN: 'not-the-gym-token' },
    cwd: ROOT,
  });
  await waitForLine(worker, /worker: polling/, 240_000);
  connection = await connectTo(server);
}, 300_000);

afterAll(async () => {
  await worker?.stop(3_000);
  await connection?.close();
  for (const s of sockets) s.destroy();
  silent?.close();
  await downDeployment(join(dir, 'gym')).catch(() => undefined);
  await server?.stop();
});

function runConfig(name: string, gymRunDir: string): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    [
      `run: { name: ${name}, gym_run_dir: ${gymRunDir}, checkpoint_dir: ${join(dir, name, 'checkpoints')}, task_queue: ${taskQueue}, rollout_task_queue: ${taskQueue}-run }`,
      'grpo: { num_prompts_per_step: 1, num_generations_per_prompt: 1, max_num_steps: 1, tasksets: [counter] }',
      'rollout_checkpointing: { restore_mode: none }',
      'trainer: { enabled: false }',
      'checkpointing: { enabled: false }',
    ].join('\n'),
  );
  return file;
}

const run = (...args: string[]) => runCommand('scripts/run.ts', [...args, '--address', server.address]);
const noStack = (text: string): void => expect(text).not.toMatch(/^\s+at .+:\d+:\d+\)?$/m);

describe('npm run run against a real server', () => {
  it('wait on a run the Gym refused prints the cause chain with the typed code and the participant', async () => {
    const start = await run('start', runConfig('cli-unauthorized', join(dir, 'gym')));
    expect(start.code, start.stderr).toBe(0);
    expect(start.stdout).toMatch(/^started run cli-unauthorized \(run id [\w-]+\)$/m);

    const wait = await run('wait', 'cli-unauthorized');
    expect(wait.code, wait.stderr).toBe(1);
    expect(wait.stdout).toBe('');
    const lines = wait.stderr.trimEnd().split('\n');
    expect(lines[0]).toBe('run: run cli-unauthorized failed:');
    expect(lines[1]).toBe('  WorkflowFailedError: Workflow execution failed');
    expect(lines[2]).toMatch(/^ {2}caused by ActivityFailure \(activity discoverGym, NON_RETRYABLE_FAILURE\): /);
    expect(lines[3]).toMatch(/^ {2}caused by ApplicationFailure \[unauthorized\] \(non-retryable\): .*policy_model/);
    expect(lines).toHaveLength(4);
    noStack(wait.stderr);

    const [stop, status, checkpoint, unknown] = await Promise.all([
      run('stop', 'cli-unauthorized'),
      run('status', 'cli-unauthorized'),
      run('checkpoint-now', 'cli-unauthorized'),
      run('wait', 'no-such-run'),
    ]);
    for (const r of [stop, status, checkpoint]) {
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr.trim()).toBe('run: run cli-unauthorized has already finished (FAILED)');
    }
    // A finished run's name is not started again (its attempts' IDs are taken).
    const reused = await run('start', runConfig('cli-unauthorized', join(dir, 'gym')));
    expect(reused.code).toBe(1);
    expect(reused.stderr.trim()).toBe(
      'run: a run named cli-unauthorized has already run (FAILED); a name is used once, as its attempts are named after it: set run.name to a new name',
    );
    expect(unknown.code, unknown.stderr).toBe(1);
    expect(unknown.stderr.trim()).toBe('run: no run named no-such-run (namespace default)');
  }, 240_000);

  it('on a terminal, wait shows a progress line from the status query; a terminated run says so', async () => {
    const config = runConfig('cli-progress', join(dir, 'silent-gym'));
    const start = await run('start', config);
    expect(start.code, start.stderr).toBe(0);
    const again = await run('start', config);
    expect(again.code).toBe(1);
    expect(again.stderr.trim()).toBe('run: a run named cli-progress is already running');

    // `script` gives the command a pseudo-terminal; -e passes its exit code on.
    const quote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;
    const command = [process.execPath, ...nodeArgs('scripts/run.ts', ['wait', 'cli-progress', '--address', server.address])].map(quote).join(' ');
    const tty = spawn('script', ['-qec', command, '/dev/null'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    tty.stdout.on('data', (d: Buffer) => (output += d.toString()));
    tty.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const exited = new Promise<number | null>((r) => tty.once('close', r));
    try {
      await waitFor('a progress line', () => /step 0 {2}mean reward — {2}in flight 0 {2}checkpoints 0 {2}\[\w+\]/.test(output), 120_000).catch((err: Error) => {
        throw new Error(`${err.message}; the terminal showed:\n${JSON.stringify(output)}`);
      });
      expect(output).toContain('\r\x1b[2K');
      await new Client({ connection: connection! }).workflow.getHandle('cli-progress').terminate('cli test over');
      expect(await exited).toBe(1);
    } finally {
      tty.kill('SIGKILL');
    }
    expect(output).toContain('run: run cli-progress was terminated:');
    expect(output).toContain('caused by TerminatedFailure: cli test over');
    noStack(output);
  }, 240_000);

  it('status and checkpoint-now on a run no worker polls for say so within seconds, naming its task queue', async () => {
    const client = new Client({ connection: connection! });
    const handle = await client.workflow.start('trainingRun', { workflowId: 'cli-no-worker', taskQueue: 'nobody-polls-this', args: [] });
    try {
      const [status, checkpoint] = await Promise.all([run('status', 'cli-no-worker'), run('checkpoint-now', 'cli-no-worker')]);
      for (const r of [status, checkpoint]) {
        expect(r.code, r.stderr).toBe(1);
        expect(r.stderr.trim()).toBe(
          'run: run cli-no-worker is running, but no worker answered within 10 s: is a worker (npm run worker) polling its task queue nobody-polls-this?',
        );
      }
    } finally {
      await handle.terminate('cli test over');
    }
  }, 240_000);
});
