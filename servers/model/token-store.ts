// The token store: the token ids and logprobs of every captured model call, keyed by staging key.
// The policy model server writes it; the trainer reads it (import this module, nothing else).
//
// Layout, under the model server's capture directory (option `capture_dir`; by default
// `<run dir>/capture/<model server name>`):
//
//   <capture_dir>/tokens/<capture key>/<model_call_id>.json      one staged call
//   <capture_dir>/ledger/<capture key>.lineage.jsonl             the episode's lineage rows (JSON Lines)
//   <capture_dir>/ledger/import-….import.jsonl                   a restore's rows until their ledger files exist
//
// Ledger rows (capture-ledger.ts writes them; readLedgerRows reads them) are token-free JSON, one
// per delivered model call: `model_call_id`, `parent_call_id` (null for an episode's first call),
// `staging_key`, `weight_version`, `admitted_at`, digests and fingerprints of the request, and on
// rows restored from a checkpoint `capture_key` (the attempt that staged it). Rows are written when
// the response starts, in call order; a call that never delivered has no row.
//
// A staging key is `<capture key>/<model_call_id>` (both path-safe: `[A-Za-z0-9][A-Za-z0-9._-]*`),
// so the file of a key is `tokens/<staging key>.json`. One file is one JSON object:
//
//   {
//     "format": "ng-token-store/1",
//     "staging_key": "wx-17/mc_5e0…",
//     "capture_key": "wx-17",              the attempt that made the call
//     "model_call_id": "mc_5e0…",
//     "weight_version": 7,                 policy version that generated it (null if the backend did not say)
//     "prompt_token_ids": [12, 40, …],     what the backend reported (vLLM `prompt_token_ids`), or null
//     "completion_token_ids": [88, …],     generated tokens (`choices[0].token_ids`), or null
//     "completion_logprobs": [-0.1, …],    one per generated token (`choices[0].logprobs.content[].logprob`), or null
//     "finish_reason": "tool_calls",
//     "complete": true,                    false when a streamed reply ended early
//     "capture": "tokens",                 "text" when the backend returned no completion token IDs
//     "completion_message": {"role": "assistant", "content": …, "tool_calls": […]},
//     "prompt_messages": [ … ]             the request's messages, only when prompt_token_ids is null
//   }
//
// A third-party backend (vLLM without `return_token_ids`, llama.cpp, a hosted API) usually returns
// no token IDs: its records say `"capture": "text"` and hold the conversation as text, which a
// trainer tokenizes itself. (Records written before these three fields existed have none of them.)
//
// Which staging keys a checkpoint still refers to is in its commit reply (`staging_keys`); the
// lineage of an episode is its ledger rows (each names its `staging_key` and `parent_call_id`). A
// restored row keeps the staging key it was staged under, so after a crash the tokens of the
// continued episode are found under the original attempt's capture key.
import { mkdir, readFile, readdir, rm, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ID_PATTERN } from '../../protocol/ids.js';
import { callFileSlots } from './file-slots.js';
import type { CompletionMessage } from './gate.js';

export const TOKEN_STORE_FORMAT = 'ng-token-store/1';
export const TOKENS_DIR = 'tokens';
export const LEDGER_DIR = 'ledger';
export const LEDGER_SUFFIX = '.lineage.jsonl';

export function ledgerPath(captureDir: string, captureKey: string): string {
  return join(captureDir, LEDGER_DIR, `${captureKey}${LEDGER_SUFFIX}`);
}

/** The lineage rows of one capture key, in call order (empty when it has no ledger). */
export async function readLedgerRows(captureDir: string, captureKey: string): Promise<Array<Record<string, unknown> & { model_call_id: string }>> {
  let text: string;
  try {
    text = await readFile(ledgerPath(captureDir, captureKey), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  return text
    .split('\n')
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l) as Record<string, unknown> & { model_call_id: string });
}

export interface StagedTokens {
  format: typeof TOKEN_STORE_FORMAT;
  staging_key: string;
  capture_key: string;
  model_call_id: string;
  weight_version: number | null;
  prompt_token_ids: number[] | null;
  completion_token_ids: number[] | null;
  completion_logprobs: number[] | null;
  finish_reason: string | null;
  complete: boolean;
  /** `tokens`: completion token IDs were captured; `text`: the backend returned none. */
  capture?: 'tokens' | 'text';
  completion_message?: CompletionMessage | null;
  /** The request's messages, kept when the backend reported no prompt token IDs. */
  prompt_messages?: unknown[];
}

export function stagingKeyOf(captureKey: string, modelCallId: string): string {
  return `${captureKey}/${modelCallId}`;
}

/** Splits a staging key into its capture key and model call ID; undefined when it is not one of ours. */
export function parseStagingKey(key: string): { captureKey: string; modelCallId: string } | undefined {
  const i = key.indexOf('/');
  if (i <= 0 || key.indexOf('/', i + 1) !== -1) return undefined;
  const captureKey = key.slice(0, i);
  const modelCallId = key.slice(i + 1);
  if (!ID_PATTERN.test(captureKey) || !ID_PATTERN.test(modelCallId)) return undefined;
  return { captureKey, modelCallId };
}

export function tokensDir(captureDir: string, captureKey?: string): string {
  return captureKey === undefined ? join(captureDir, TOKENS_DIR) : join(captureDir, TOKENS_DIR, captureKey);
}

export function stagedTokensPath(captureDir: string, stagingKey: string): string {
  const p = parseStagingKey(stagingKey);
  if (!p) throw new Error(`'${stagingKey}' is not a staging key of the token store`);
  return join(captureDir, TOKENS_DIR, p.captureKey, `${p.modelCallId}.json`);
}

/** The staged tokens of one key, or undefined when the store has none. */
export async function readStagedTokens(captureDir: string, stagingKey: string): Promise<StagedTokens | undefined> {
  let text: string;
  try {
    text = await readFile(stagedTokensPath(captureDir, stagingKey), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  const v = JSON.parse(text) as StagedTokens;
  if (v.format !== TOKEN_STORE_FORMAT) throw new Error(`${stagingKey}: unknown token store format ${JSON.stringify(v.format)}`);
  return v;
}

/** Staging keys stored under one capture key (sorted). */
export async function listStagingKeys(captureDir: string, captureKey: string): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(tokensDir(captureDir, captureKey));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  return names
    .filter((n) => n.endsWith('.json'))
    .map((n) => stagingKeyOf(captureKey, n.slice(0, -'.json'.length)))
    .sort();
}

// --- writing (the model server) -------------------------------------------------------------------

/** Writes one staged call; `dirExists` skips creating its capture key's directory. */
export async function writeStagedTokens(captureDir: string, entry: StagedTokens, opts: { dirExists?: boolean } = {}): Promise<void> {
  const file = stagedTokensPath(captureDir, entry.staging_key);
  const text = JSON.stringify(entry);
  await callFileSlots.run(async () => {
    if (!opts.dirExists) await mkdir(tokensDir(captureDir, entry.capture_key), { recursive: true });
    await writeFile(file, text);
  });
}

/**
 * Deletes the staged calls of one capture key except the staging keys in `keep`; removes the
 * directory once it is empty. Returns how many files were deleted.
 */
export async function deleteStagedTokens(captureDir: string, captureKey: string, keep: ReadonlySet<string> = new Set()): Promise<number> {
  const dir = tokensDir(captureDir, captureKey);
  if (keep.size === 0) {
    let n = 0;
    try {
      n = (await readdir(dir)).length;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 0;
      throw err;
    }
    await rm(dir, { recursive: true, force: true });
    return n;
  }
  const keys = await listStagingKeys(captureDir, captureKey);
  let deleted = 0;
  for (const k of keys) {
    if (keep.has(k)) continue;
    await rm(stagedTokensPath(captureDir, k), { force: true });
    deleted++;
  }
  if (deleted === keys.length) await rmdir(dir).catch(() => undefined);
  return deleted;
}
