// Every command a user runs explains itself: `--help` and `-h` list its verbs, flags and the
// environment variables it reads and exit 0; an unknown flag (or verb) prints one line and the
// usage and exits 2. `run` fails fast naming the Temporal address when nothing listens there.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { refusedAddress } from '../helpers/ports.js';
import { envWithout, ROOT, runCommand } from '../helpers/cli.js';

interface Command {
  name: string;
  script: string;
  verbs: string[];
  flags: string[];
  env: string[];
  /** Where the environment it reads is read (scanned for names the help must list too). */
  sources: string[];
}

const BOOTSTRAP_ENV = ['TEMPORAL_CLI_PATH', 'TEMPORAL_TEST_SERVER_PATH'];

const COMMANDS: Command[] = [
  {
    name: 'run',
    script: 'scripts/run.ts',
    verbs: ['start', 'status', 'checkpoint-now', 'stop', 'wait'],
    flags: ['--address', '--namespace', '--connect-timeout-s'],
    env: ['TEMPORAL_ADDRESS'],
    sources: ['scripts/run.ts'],
  },
  {
    name: 'gym',
    script: 'scripts/gym.ts',
    verbs: ['up', 'down', 'kill', 'restart', 'status'],
    flags: ['--dir', '--all', '--server'],
    env: ['GYM_CONTROL_TOKEN', 'GYM_SESSION_SECRET', 'LOG_LEVEL', 'NG_RECORDS_DEFER_MIN_BYTES', 'OTEL_EXPORTER_OTLP_ENDPOINT', 'api_key_env'],
    sources: [
      'scripts/gym.ts',
      'servers/common/deployment.ts',
      'servers/common/app.ts',
      'servers/main.ts',
      'servers/control/storage/reader.ts',
      'servers/common/tracing.ts',
    ],
  },
  {
    name: 'worker',
    script: 'worker.ts',
    verbs: [],
    flags: [
      '--address',
      '--namespace',
      '--task-queue',
      '--rollout-task-queue',
      '--only',
      '--connect-timeout-s',
      '--metrics-address',
      '--log-format',
      '--otlp-endpoint',
    ],
    env: ['GYM_CONTROL_TOKEN', 'TEMPORAL_ADDRESS', 'WORKER_METRICS_ADDRESS', 'WORKER_LOG_FORMAT', 'OTEL_EXPORTER_OTLP_ENDPOINT'],
    sources: ['worker.ts', 'worker-telemetry.ts', 'servers/common/tracing.ts'],
  },
  {
    name: 'report',
    script: 'scripts/report.ts',
    verbs: [],
    flags: ['--out', '--checkpoint-dir', '--address', '--namespace', '--connect-timeout-s'],
    env: ['TEMPORAL_ADDRESS'],
    sources: ['scripts/report.ts', 'scripts/report/fetch.ts', 'scripts/temporal-connect.ts'],
  },
  { name: 'demo', script: 'scripts/demo.ts', verbs: [], flags: ['--keep'], env: ['GYM_CONTROL_TOKEN'], sources: ['scripts/demo.ts'] },
  {
    name: 'temporal-dev',
    script: 'scripts/temporal-dev.mjs',
    verbs: [],
    flags: ['--port', '--ui-port', '--db', '--in-memory', '--headless', '--namespace', '--log-level'],
    env: [],
    sources: ['scripts/temporal-dev.mjs'],
  },
];

/** Environment variable names a source file reads. */
function envRead(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const names = [/process\.env\.([A-Z][A-Z0-9_]*)/g, /_ENV\s*=\s*'([A-Z][A-Z0-9_]*)'/g, /envVar:\s*'([A-Z][A-Z0-9_]*)'/g].flatMap((re) =>
    [...text.matchAll(re)].map((m) => m[1]!),
  );
  return [...new Set(names)];
}

const noStack = (text: string): void => expect(text).not.toMatch(/^\s+at .+:\d+:\d+\)?$/m);

describe.each(COMMANDS)('$name', (cmd) => {
  it('--help and -h list every verb, flag and environment variable, and exit 0; an unknown flag exits 2 with the usage', async () => {
    const [long, short, unknown] = await Promise.all([
      runCommand(cmd.script, ['--help']),
      runCommand(cmd.script, ['-h']),
      runCommand(cmd.script, ['--frobnicate']),
    ]);
    expect(long.code, long.stderr).toBe(0);
    expect(long.stderr).toBe('');
    expect(short.code, short.stderr).toBe(0);
    expect(short.stdout).toBe(long.stdout);
    const help = long.stdout;
    expect(help).toMatch(/^usage: /);
    for (const verb of cmd.verbs) expect(help).toMatch(new RegExp(`^  ${verb} `, 'm'));
    for (const flag of [...cmd.flags, '--help', '-h']) expect(help).toContain(flag);
    const readHere = cmd.sources.flatMap(envRead);
    for (const name of new Set([...cmd.env, ...readHere, ...envRead('scripts/bootstrap.mjs'), ...BOOTSTRAP_ENV])) expect(help, name).toContain(name);

    expect(unknown.code, unknown.stdout + unknown.stderr).toBe(2);
    expect(unknown.stdout).toBe('');
    const [first, ...rest] = unknown.stderr.trimEnd().split('\n');
    expect(first).toBe(`${cmd.name}: unknown option '--frobnicate'`);
    expect(rest[0]).toMatch(/^usage: /);
    noStack(unknown.stderr);
  }, 180_000);
});

describe('run: usage errors', () => {
  it('an unknown verb, a missing verb and a missing argument exit 2 with one line and the usage', async () => {
    const [verb, none, missing] = await Promise.all([
      runCommand('scripts/run.ts', ['frobnicate', 'x']),
      runCommand('scripts/run.ts', []),
      runCommand('scripts/run.ts', ['status']),
    ]);
    expect(verb.code).toBe(2);
    expect(verb.stderr.split('\n')[0]).toBe("run: unknown verb 'frobnicate' (one of start, status, checkpoint-now, stop, wait)");
    expect(none.code).toBe(2);
    expect(none.stderr.split('\n')[0]).toMatch(/^run: which verb\?/);
    expect(missing.code).toBe(2);
    expect(missing.stderr.split('\n')[0]).toBe('run: status takes exactly <run>');
    for (const r of [verb, none, missing]) {
      expect(r.stderr.split('\n')[1]).toMatch(/^usage: npm run run -- /);
      noStack(r.stderr);
    }
  }, 180_000);
});

describe('worker: usage errors', () => {
  it('--only takes control or rollouts: anything else exits 2 with one line and the usage, before connecting', async () => {
    const r = await runCommand('worker.ts', ['--only', 'everything'], { env: { ...process.env, GYM_CONTROL_TOKEN: 'x' } });
    expect(r.code).toBe(2);
    expect(r.stderr.split('\n')[0]).toBe("worker: --only must be control or rollouts, not 'everything'");
    expect(r.stderr.split('\n')[1]).toMatch(/^usage: npm run worker -- /);
    noStack(r.stderr);
  }, 180_000);
});

describe('run: no Temporal server at the address', () => {
  it('fails within seconds naming the address, where it came from, and why', async () => {
    const address = await refusedAddress();
    // Started together, so both see the same machine load: the failure may take the connect
    // timeout (2 s) longer than printing the help, not the SDK's 10 s default and more.
    const [help, flag, env] = await Promise.all([
      runCommand('scripts/run.ts', ['--help']),
      runCommand('scripts/run.ts', ['status', 'some-run', '--address', address], { env: envWithout('TEMPORAL_ADDRESS') }),
      runCommand('scripts/run.ts', ['wait', 'some-run'], { env: { ...process.env, TEMPORAL_ADDRESS: address } }),
    ]);
    expect(flag.code, flag.stderr).toBe(1);
    expect(flag.stderr.trim()).toBe(`run: cannot reach the Temporal server at ${address} (--address): connection refused`);
    expect(env.code, env.stderr).toBe(1);
    expect(env.stderr.trim()).toBe(`run: cannot reach the Temporal server at ${address} (TEMPORAL_ADDRESS): connection refused`);
    expect(flag.stdout + env.stdout).toBe('');
    expect(flag.ms - help.ms, `help ${help.ms} ms, status ${flag.ms} ms`).toBeLessThan(7_000);
    expect(env.ms - help.ms, `help ${help.ms} ms, wait ${env.ms} ms`).toBeLessThan(7_000);
  }, 180_000);
});
