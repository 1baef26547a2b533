// The `none` trainer (activities/rollout-batches.ts): each step's batch appended once to
// `<checkpoint_dir>/rollout_batches.jsonl` with the calls the policy model server captured (the
// last attempt's ledger, which holds what a restore imported), as text or tokens; a retried step
// and a step collected again after a takeover replace what was there from that step on; a torn
// last line is cut. Also the run config's `trainer:` choice.
import { writeFileSync } from 'node:fs';
import { appendFile, mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { beforeEach, describe, expect, it } from 'vitest';
import { captureDirsOf, collectBatch, readRolloutBatches, ROLLOUT_BATCHES_FILE, type CollectBatchInput } from '../../activities/rollout-batches.js';
import { createTrainerActivities } from '../../activities/trainer.js';
import { RunConfigSchema } from '../../protocol/run-config.js';
import { ledgerPath, stagingKeyOf, writeStagedTokens, TOKEN_STORE_FORMAT } from '../../servers/model/token-store.js';
import { tempDir } from '../helpers/temp-dir.js';

let tmp: string;
let gymRunDir: string;
let checkpointDir: string;
let captureDir: string;

beforeEach(() => {
  tmp = tempDir('rollout-batches');
  gymRunDir = join(tmp, 'gym');
  checkpointDir = join(tmp, 'ckpt');
  captureDir = join(gymRunDir, 'capture', 'policy_model');
  writeFileSync(join(tmp, 'placeholder'), '');
});

async function deployment(extra = ''): Promise<void> {
  await mkdir(gymRunDir, { recursive: true });
  writeFileSync(
    join(gymRunDir, 'deployment.yaml'),
    `servers:\n  policy_model: { kind: model, options: { backend_url: "http://127.0.0.1:1/v1", backend_api: openai, served_model: m } }\n  simple_agent: { kind: agent, options: { model: policy_model } }\n${extra}`,
  );
}

/** One captured call: a ledger row under `ledgerKey` for a call staged under `stagedKey`. */
async function captured(ledgerKey: string, stagedKey: string, id: string, opts: { tokens?: boolean; text?: string } = {}): Promise<void> {
  const staging = stagingKeyOf(stagedKey, id);
  await writeStagedTokens(captureDir, {
    format: TOKEN_STORE_FORMAT,
    staging_key: staging,
    capture_key: stagedKey,
    model_call_id: id,
    weight_version: null,
    prompt_token_ids: opts.tokens ? [1, 2] : null,
    completion_token_ids: opts.tokens ? [3] : null,
    completion_logprobs: null,
    finish_reason: 'tool_calls',
    complete: true,
    capture: opts.tokens ? 'tokens' : 'text',
    completion_message: { role: 'assistant', content: opts.text ?? '', tool_calls: [] },
    ...(opts.tokens ? {} : { prompt_messages: [{ role: 'user', content: `prompt of ${id}` }] }),
  });
  await mkdir(join(captureDir, 'ledger'), { recursive: true });
  const row = { model_call_id: id, staging_key: staging, parent_call_id: null, ...(ledgerKey !== stagedKey ? { capture_key: stagedKey } : {}) };
  await appendFile(ledgerPath(captureDir, ledgerKey), `${JSON.stringify(row)}\n`);
}

const input = (step: number, siblings: CollectBatchInput['batch'][number]['siblings']): CollectBatchInput => ({
  run: 'r',
  checkpointDir,
  gymRunDir,
  step,
  policyVersion: 0,
  batch: [{ group_id: `p${step}`, siblings }],
});

describe('the rollout batches file', () => {
  it('holds one line per sibling with its reward, attempts and calls; a continued rollout has the saved calls and its own', async () => {
    await deployment();
    // p0.g0 ran twice: attempt 0 made call c1 and was checkpointed; attempt 1 imported it and made c2.
    await captured('p0.g0-a1', 'p0.g0', 'c1', { text: 'first' });
    await captured('p0.g0-a1', 'p0.g0-a1', 'c2', { text: 'second' });
    await captured('p0.g1', 'p0.g1', 'c9', { tokens: true });
    const out = await collectBatch(
      input(1, [
        { rollout_id: 'p0.g0', reward: 1, mask: false, captureKeys: ['p0.g0', 'p0.g0-a1'] },
        { rollout_id: 'p0.g1', reward: 0, mask: false, captureKeys: ['p0.g1'] },
      ]),
    );
    expect(out).toMatchObject({ lines: 2, calls: 3, tokenCalls: 1, textCalls: 2 });
    const lines = await readRolloutBatches(checkpointDir);
    expect(lines.map((l) => [l.step, l.rollout_id, l.reward, l.attempts])).toEqual([
      [1, 'p0.g0', 1, ['p0.g0', 'p0.g0-a1']],
      [1, 'p0.g1', 0, ['p0.g1']],
    ]);
    expect(lines[0]!.calls.map((c: any) => [c.capture_key, c.model_call_id, c.capture, c.completion_message.content])).toEqual([
      ['p0.g0', 'c1', 'text', 'first'],
      ['p0.g0-a1', 'c2', 'text', 'second'],
    ]);
    expect(lines[0]!.calls[0].prompt_messages).toEqual([{ role: 'user', content: 'prompt of c1' }]);
    expect(lines[1]!.calls[0]).toMatchObject({ capture: 'tokens', prompt_token_ids: [1, 2], completion_token_ids: [3] });
    expect(lines[1]!.calls[0].prompt_messages).toBeUndefined();
  });

  it('a retried step is not appended twice; a step collected again replaces the steps from it on; a torn tail is cut', async () => {
    await deployment();
    const s = (id: string) => [{ rollout_id: id, reward: 0.5, mask: false, captureKeys: [id] }];
    await collectBatch(input(1, s('a')));
    await collectBatch(input(2, s('b')));
    await collectBatch(input(2, s('b'))); // the activity ran again
    expect((await readRolloutBatches(checkpointDir)).map((l) => [l.step, l.rollout_id])).toEqual([
      [1, 'a'],
      [2, 'b'],
    ]);
    // A run that took the directory over from a snapshot at step 1 collects step 2 anew.
    await collectBatch(input(3, s('c')));
    await collectBatch(input(2, s('b2')));
    expect((await readRolloutBatches(checkpointDir)).map((l) => [l.step, l.rollout_id])).toEqual([
      [1, 'a'],
      [2, 'b2'],
    ]);
    // A crash in the middle of an append left half a line.
    await appendFile(join(checkpointDir, ROLLOUT_BATCHES_FILE), '{"format":"rollout-checkpoint/rollout-batch/1","step":3,"rol');
    await collectBatch(input(3, s('c')));
    expect((await readRolloutBatches(checkpointDir)).map((l) => [l.step, l.rollout_id])).toEqual([
      [1, 'a'],
      [2, 'b2'],
      [3, 'c'],
    ]);
  });

  it('refuses a file that is not ours, as an invariant (not retried)', async () => {
    await deployment();
    await mkdir(checkpointDir, { recursive: true });
    writeFileSync(join(checkpointDir, ROLLOUT_BATCHES_FILE), '{"something":"else"}\n');
    const err = await collectBatch(input(1, [])).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApplicationFailure);
    expect((err as ApplicationFailure).type).toBe('invariant_error');
    expect(await readFile(join(checkpointDir, ROLLOUT_BATCHES_FILE), 'utf8')).toBe('{"something":"else"}\n');
  });

  it('finds the capture directory of every policy model server, a configured one too', async () => {
    await deployment('  judge_model: { kind: model, options: { backend: x, capture_dir: /var/capture/judge } }\n');
    expect(await captureDirsOf(gymRunDir)).toEqual([captureDir, '/var/capture/judge']);
  });
});

describe('trainStep with trainer none', () => {
  it('collects the batch, needs no inference backend and keeps the policy version', async () => {
    await deployment();
    await captured('g', 'g', 'c1');
    const { trainStep } = createTrainerActivities({ states: new Map(), log: () => undefined });
    const r = await trainStep({
      run: 'r',
      checkpointDir,
      trainer: 'none',
      gymRunDir,
      expectedVersion: 0,
      step: 1,
      batch: [
        {
          group_id: 'p0',
          siblings: [
            { rollout_id: 'g', reward: 1, mask: false, captureKeys: ['g'] },
            { rollout_id: 'h', reward: 0, mask: true, captureKeys: ['h'] },
          ],
        },
      ],
    });
    expect(r).toMatchObject({ version: 0, step: 1, meanReward: 1, usedCalls: 1, contributingGroups: 0 });
    expect((await readRolloutBatches(checkpointDir)).map((l) => [l.rollout_id, l.mask, l.calls.length])).toEqual([
      ['g', false, 1],
      ['h', true, 0],
    ]);
  });

  it('tiny_grpo still needs the backend to refit', async () => {
    const { trainStep } = createTrainerActivities({ states: new Map(), log: () => undefined });
    const err = await trainStep({ run: 'r', checkpointDir, expectedVersion: 0, step: 1, batch: [] }).catch((e: unknown) => e);
    expect((err as ApplicationFailure).message).toContain('backendUrl is required');
  });
});

describe('the run config trainer choice', () => {
  const base = { run: { name: 'r', gym_run_dir: 'g', checkpoint_dir: 'c' } };
  it('defaults to tiny_grpo; `trainer: none` is short for `{kind: none}`; enabled stays', () => {
    expect(RunConfigSchema.parse(base).trainer).toEqual({ kind: 'tiny_grpo', enabled: true });
    expect(RunConfigSchema.parse({ ...base, trainer: 'none' }).trainer).toEqual({ kind: 'none', enabled: true });
    expect(RunConfigSchema.parse({ ...base, trainer: { kind: 'none' } }).trainer).toEqual({ kind: 'none', enabled: true });
    expect(RunConfigSchema.parse({ ...base, trainer: { enabled: false } }).trainer).toEqual({ kind: 'tiny_grpo', enabled: false });
    const bad = RunConfigSchema.safeParse({ ...base, trainer: 'verl' });
    expect(bad.success).toBe(false);
    expect(bad.error!.issues[0]!.path).toEqual(['trainer', 'kind']);
  });
});
