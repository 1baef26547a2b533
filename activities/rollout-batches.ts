// The `none` trainer (run config `trainer: none`): no training, no refit, no anchors. Each step's
// batch is appended to `<checkpoint_dir>/rollout_batches.jsonl` for an external trainer (NeMo RL,
// verl) to read: one line per sibling, with what its rollout said to the model and the reward.
//
// A line (format ROLLOUT_BATCH_FORMAT):
//
//   {"format": "rollout-checkpoint/rollout-batch/1", "run": "…", "step": 3, "group_id": "p7",
//    "rollout_id": "p7.g2", "attempts": ["p7.g2", "p7.g2-a1"], "reward": 1.0, "mask": false,
//    "policy_version": 0,
//    "calls": [{"capture_key": "p7.g2", "model_call_id": "mc_…", "weight_version": null,
//               "capture": "text" | "tokens",
//               "prompt_token_ids": […] | null, "prompt_messages": [ … ]  (when there are no prompt IDs),
//               "completion_token_ids": […] | null, "completion_logprobs": […] | null,
//               "completion_message": {"role": "assistant", "content": …, "tool_calls": […]},
//               "finish_reason": "stop", "complete": true}]}
//
// `attempts` are the physical attempts whose model calls form the trajectory; `calls` come from the
// policy model server's capture (servers/model/token-store.ts) of the last attempt, whose ledger
// holds the calls the earlier attempts saved (a restore imports them) and its own after. A call
// that never delivered its reply has no row, so it is not here. `capture: "text"`: the backend
// returned no token IDs (llama.cpp, most hosted APIs) and the trainer tokenizes the messages itself.
//
// Durability: the step's lines are written in one append and fsynced before the activity returns,
// and the workflow history records that it returned. A retried step (activity at least once), and a
// run that took over the directory and collects a step again, first cut the file back to where that
// step began (and a torn last line of a crash), so the file holds each step once, as last collected.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { CaptureKeySchema } from '../protocol/ids.js';
import { readLedgerRows, readStagedTokens, type StagedTokens } from '../servers/model/token-store.js';
import { heartbeating, invariantFailure, withStorageFailure as storage } from './activity-context.js';
import { fsyncPath } from '../servers/common/durable-files.js';

export const ROLLOUT_BATCHES_FILE = 'rollout_batches.jsonl';
export const ROLLOUT_BATCH_FORMAT = 'rollout-checkpoint/rollout-batch/1';

export const CollectBatchInputSchema = z.strictObject({
  run: z.string().min(1),
  checkpointDir: z.string().min(1),
  /** The Gym run dir (`run.gym_run_dir`): its deployment names the policy model servers and their capture dirs. */
  gymRunDir: z.string().min(1),
  step: z.number().int().min(1),
  /** The policy version the batch's rollouts ran under (no refit: the same for the whole run). */
  policyVersion: z.number().int().min(0),
  batch: z.array(
    z.strictObject({
      group_id: z.string().min(1),
      siblings: z.array(
        z.strictObject({
          rollout_id: z.string().min(1),
          reward: z.number(),
          mask: z.boolean(),
          captureKeys: z.array(CaptureKeySchema),
          policyVersion: z.number().int().min(0).optional(),
        }),
      ),
    }),
  ),
});
export type CollectBatchInput = z.infer<typeof CollectBatchInputSchema>;

export interface CollectedBatch {
  file: string;
  lines: number;
  calls: number;
  /** Calls captured with token IDs / as text only. */
  tokenCalls: number;
  textCalls: number;
}

export interface BatchCall {
  capture_key: string;
  model_call_id: string;
  weight_version: number | null;
  capture: 'tokens' | 'text';
  prompt_token_ids: number[] | null;
  prompt_messages?: unknown[];
  completion_token_ids: number[] | null;
  completion_logprobs: number[] | null;
  completion_message: unknown;
  finish_reason: string | null;
  complete: boolean;
}

/** Capture directories of the deployment's policy model servers (as servers/model/module.ts picks them). */
export async function captureDirsOf(gymRunDir: string): Promise<string[]> {
  const file = path.join(gymRunDir, 'deployment.yaml');
  let doc: { servers?: Record<string, { kind?: string; options?: { capture_dir?: unknown } }> };
  try {
    doc = parseYaml(await fsp.readFile(file, 'utf8')) as typeof doc;
  } catch (err) {
    throw invariantFailure(`trainer none: cannot read the Gym deployment ${file}: ${(err as Error).message}`);
  }
  return Object.entries(doc.servers ?? {})
    .filter(([, s]) => s.kind === 'model')
    .map(([name, s]) => (typeof s.options?.capture_dir === 'string' ? path.resolve(s.options.capture_dir) : path.join(gymRunDir, 'capture', name)));
}

/** The calls of a trajectory: the ledger of its last attempt (with what earlier attempts saved), in call order. */
export async function trajectoryCalls(captureDirs: readonly string[], captureKeys: readonly string[]): Promise<BatchCall[]> {
  const last = captureKeys.at(-1);
  if (last === undefined) return [];
  for (const dir of captureDirs) {
    const rows = await readLedgerRows(dir, last);
    if (rows.length === 0) continue;
    const out: BatchCall[] = [];
    for (const row of rows) {
      const key = typeof row.staging_key === 'string' ? row.staging_key : undefined;
      const staged = key ? await readStagedTokens(dir, key) : undefined;
      out.push(callOf(row, staged));
    }
    return out;
  }
  return [];
}

function callOf(row: Record<string, unknown> & { model_call_id: string }, t: StagedTokens | undefined): BatchCall {
  const captureKey = typeof row.capture_key === 'string' ? row.capture_key : (t?.capture_key ?? '');
  return {
    capture_key: captureKey,
    model_call_id: row.model_call_id,
    weight_version: t?.weight_version ?? (typeof row.weight_version === 'number' ? row.weight_version : null),
    capture: t?.completion_token_ids ? 'tokens' : 'text',
    prompt_token_ids: t?.prompt_token_ids ?? null,
    ...(t?.prompt_messages ? { prompt_messages: t.prompt_messages } : {}),
    completion_token_ids: t?.completion_token_ids ?? null,
    completion_logprobs: t?.completion_logprobs ?? null,
    completion_message: t?.completion_message ?? null,
    finish_reason: t?.finish_reason ?? null,
    complete: t?.complete ?? false,
  };
}

/**
 * The byte length of the file's lines before `step` (the steps are in order), without a torn last
 * line. A line that is not ours fails the step: the file is someone else's.
 */
function keptLength(text: string, step: number, file: string): number {
  let offset = 0;
  while (offset < text.length) {
    const nl = text.indexOf('\n', offset);
    if (nl === -1) break; // torn: the crash was mid-append
    const line = text.slice(offset, nl);
    let parsed: { format?: unknown; step?: unknown };
    try {
      parsed = JSON.parse(line) as typeof parsed;
    } catch {
      throw invariantFailure(`${file}: line at byte ${offset} is not JSON`);
    }
    if (parsed.format !== ROLLOUT_BATCH_FORMAT || typeof parsed.step !== 'number')
      throw invariantFailure(`${file}: line at byte ${offset} is not a ${ROLLOUT_BATCH_FORMAT} line`);
    if (parsed.step >= step) break;
    offset = nl + 1;
  }
  return Buffer.byteLength(text.slice(0, offset), 'utf8');
}

export async function collectBatch(raw: CollectBatchInput): Promise<CollectedBatch> {
  const parsed = CollectBatchInputSchema.safeParse(raw);
  if (!parsed.success) {
    const i = parsed.error.issues[0]!;
    throw invariantFailure(`collectBatch: invalid input at ${i.path.join('.') || '(root)'}: ${i.message}`);
  }
  const input = parsed.data;
  const file = path.join(input.checkpointDir, ROLLOUT_BATCHES_FILE);
  return heartbeating({ op: 'collectBatch', run: input.run, step: input.step }, async () => {
    const dirs = await captureDirsOf(input.gymRunDir);
    const lines: string[] = [];
    let calls = 0;
    let tokenCalls = 0;
    for (const g of input.batch) {
      for (const s of g.siblings) {
        const trajectory = await storage(`reading the capture of ${s.rollout_id}`, () => trajectoryCalls(dirs, s.captureKeys));
        calls += trajectory.length;
        tokenCalls += trajectory.filter((c) => c.capture === 'tokens').length;
        lines.push(
          JSON.stringify({
            format: ROLLOUT_BATCH_FORMAT,
            run: input.run,
            step: input.step,
            group_id: g.group_id,
            rollout_id: s.rollout_id,
            attempts: s.captureKeys,
            reward: s.reward,
            mask: s.mask,
            policy_version: s.policyVersion ?? input.policyVersion,
            calls: trajectory,
          }),
        );
      }
    }
    await storage(`appending step ${input.step} to ${file}`, async () => {
      await fsp.mkdir(input.checkpointDir, { recursive: true });
      const existing = await fsp.readFile(file, 'utf8').catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOENT') return undefined;
        throw err;
      });
      const fh = await fsp.open(file, 'a+');
      try {
        if (existing !== undefined) {
          const keep = keptLength(existing, input.step, file);
          if (keep !== Buffer.byteLength(existing, 'utf8')) await fh.truncate(keep);
        }
        if (lines.length) await fh.appendFile(`${lines.join('\n')}\n`);
        await fh.sync();
      } finally {
        await fh.close();
      }
      if (existing === undefined) await fsyncPath(input.checkpointDir);
    });
    return { file, lines: lines.length, calls, tokenCalls, textCalls: calls - tokenCalls };
  });
}

/** Reads the file back (tests, tools): every line, parsed. */
// biome-ignore lint/suspicious/noExplicitAny: loose JSON for tests and tools, which pick the fields they check.
export async function readRolloutBatches(checkpointDir: string): Promise<Array<Record<string, any>>> {
  const text = await fsp.readFile(path.join(checkpointDir, ROLLOUT_BATCHES_FILE), 'utf8');
  return (
    text
      .split('\n')
      .filter((l) => l.length > 0)
      // biome-ignore lint/suspicious/noExplicitAny: as above.
      .map((l) => JSON.parse(l) as Record<string, any>)
  );
}
