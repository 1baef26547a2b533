// The Python client's run config (clients/python) against the TypeScript client's: the checked-in
// JSON Schema is the current run config's; Python turns a YAML file into the very bytes the workflow
// gets from `npm run run -- start` (JSON.stringify of RunConfigSchema.parse), YAML 1.1 look-alikes
// and number formats included; and a bad config fails naming the same key.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { loadRunConfig } from '../../scripts/run.js';
import { runConfigJsonSchemaText, SCHEMA_FILE, stringShorthandKey } from '../../scripts/python-schema.js';
import { ConfigError } from '../../servers/common/config-error.js';
import { ROOT } from '../helpers/cli.js';
import { tempDir } from '../helpers/temp-dir.js';

const PYTHON = join(ROOT, '.tools/venv/bin/python');
const dir = tempDir('python-client-config', 'file');

function python(args: string[]): { code: number | null; stdout: string; stderr: string } {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run node scripts/bootstrap.mjs (it installs clients/python/requirements.txt)`);
  const r = spawnSync(PYTHON, args, {
    cwd: dir,
    encoding: 'utf8',
    env: { ...process.env, PYTHONPATH: join(ROOT, 'clients/python'), PYTHONDONTWRITEBYTECODE: '1' },
    timeout: 30_000,
  });
  if (r.error) throw r.error;
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Each file through rollout_checkpoint.config in one Python process: its config JSON, or the key of its error. */
function pythonParse(files: string[]): ({ json: string } | { key: string; message: string })[] {
  const script = [
    'import json, sys',
    'from rollout_checkpoint.config import ConfigError, load_run_config, run_config_json',
    'for f in sys.argv[1:]:',
    '    try: print(json.dumps({"json": run_config_json(load_run_config(f))}))',
    '    except ConfigError as e: print(json.dumps({"key": e.key, "message": e.detail}))',
  ].join('\n');
  const r = python(['-c', script, ...files]);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
}

let n = 0;
function yamlFile(text: string): string {
  const file = join(dir, `config-${++n}.yaml`);
  writeFileSync(file, text);
  return file;
}

const RUN = 'run: { name: r, gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c }';

describe('the Python client run config', () => {
  it('run_config.schema.json is the current run config schema (else: npx tsx scripts/python-schema.ts)', () => {
    expect(readFileSync(SCHEMA_FILE, 'utf8'), 'stale: regenerate it with npx tsx scripts/python-schema.ts').toBe(runConfigJsonSchemaText());
  });

  it('the schema generator refuses a preprocess the Python client would not know', () => {
    const preprocess = z.preprocess((v) => (typeof v === 'string' ? { kind: v } : v), z.object({ kind: z.string() }));
    expect(stringShorthandKey(preprocess._zod.def.in._zod.def.transform as (v: unknown, ctx: unknown) => unknown, 'x')).toBe('kind');
    expect(() => stringShorthandKey((v) => (typeof v === 'string' ? v.split(',') : v), 'trainer')).toThrow(/trainer is not a string shorthand/);
  });

  it('parses every example and YAML 1.2 corner into the bytes RunConfigSchema.parse gives', () => {
    const files = [
      join(ROOT, 'examples/run.yaml'),
      join(ROOT, 'examples/run-llama.yaml'),
      yamlFile(`${RUN}\n`),
      // Keys in another order than the schema's; records keep theirs.
      yamlFile(
        `controller: { late_result_wait_ms: 5 }\ngrpo: { environments: { weather: w, counter: c }, tasksets: [weather, counter] }\n${RUN}\ntrainer: { enabled: false }\n`,
      ),
      // YAML 1.1 would read booleans, octal, a date and a merge key here; YAML 1.2 (the TS client) does not.
      yamlFile(
        [
          'run:',
          '  name: on',
          '  gym_run_dir: yes',
          '  checkpoint_dir: 2024-01-01',
          '  seed: 0o17',
          '  task_queue: "0x1F"',
          '  rollout_task_queue: off',
          'grpo:',
          '  max_num_steps: 010',
          '  num_prompts_per_step: 0x2',
          '  num_generations_per_prompt: 4.0',
          '  environments: { 1: one, true: t, null: n, 2.50: x, "<<": y }',
          'rollout_checkpointing:',
          '  snapshot_attempt_interval_s: 0.000005',
          '  gym: { prepare_timeout_s: 1e21, require_model_participant: True }',
          'async_rl: { rollout_timeout_s: .5, max_in_flight_groups: +7 }',
          'controller: { run_heartbeat_timeout_s: 12.50, gym_recovery_timeout_s: 1e3 }',
          'trainer: none',
          'rollout_recovery:',
          '  agent_target_level_overrides:',
          '    <<: sibling',
          '    simple_agent: prompt_group',
          '',
        ].join('\n'),
      ),
    ];
    const ts = files.map((f) => JSON.stringify(loadRunConfig(f)));
    const py = pythonParse(files);
    for (const [i, f] of files.entries()) expect(py[i], f).toEqual({ json: ts[i] });
    // The command line prints the same (`config` needs no server).
    const cli = python(['-m', 'rollout_checkpoint', 'config', files[0]!]);
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stdout).toBe(`${ts[0]}\n`);
  });

  it('a bad config fails naming the key the TypeScript client names', () => {
    const cases = [
      `${RUN}\nfoo: 1\n`,
      'run: { name: r, gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c, foo: 1 }\n',
      'run: { name: "bad name", gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c }\n',
      'run: { name: "trailing\\n", gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c }\n',
      'run: { gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c }\ngrpo: { max_num_steps: 0 }\n',
      'grpo: { max_num_steps: 0 }\n',
      `${RUN}\ngrpo: { max_num_steps: 0 }\n`,
      `${RUN}\ngrpo: { tasksets: [] }\n`,
      `${RUN}\ngrpo: { tasksets: [counter, nope] }\n`,
      `${RUN}\ntrainer: bogus\n`,
      `${RUN}\ntrainer: 5\n`,
      `${RUN}\nasync_rl: { rollout_timeout_s: -1 }\n`,
      `${RUN}\nasync_rl: { rollout_timeout_s: abc }\n`,
      `${RUN}\nrollout_checkpointing: { gym: { prepare_timeout_s: .inf } }\n`,
      `${RUN}\ncontroller: { max_history_events: 1.5 }\n`,
      'run: { name: r, gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c, seed: 9007199254740993 }\n',
      'run: { name: r, gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c, seed: x, zzz: 1 }\n',
      `${RUN}\nrollout_recovery: { agent_target_level_overrides: { a: turn, b: nope } }\n`,
      `${RUN}\ncheckpointing: { enabled: yes }\n`,
      `${RUN}\n${RUN}\n`,
      '',
      'run: [\n',
    ].map(yamlFile);
    const keys = cases.map((f) => {
      try {
        loadRunConfig(f);
      } catch (err) {
        if (err instanceof ConfigError) return err.key;
        throw err;
      }
      throw new Error(`${f} parsed in TypeScript`);
    });
    const py = pythonParse(cases);
    for (const [i, f] of cases.entries()) {
      expect(py[i], `${readFileSync(f, 'utf8')}`).toMatchObject({ key: keys[i] });
      expect((py[i] as { message: string }).message).not.toBe('');
    }
    // The command line: exit 2 and the key, before any connection is tried.
    const cli = python(['-m', 'rollout_checkpoint', 'start', cases[1]!, '--address', '127.0.0.1:1']);
    expect(cli.code).toBe(2);
    expect(cli.stderr.trim()).toBe('rollout_checkpoint: config error: run.foo: unknown key (allowed keys are listed in the docs of run)');
  });
});
