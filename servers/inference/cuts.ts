// The tiny-policy backend's generation-cut service (participants.md §5.6, §6.3). While a captured
// call is decoding, the policy model server may ask, at a checkpoint's prepare, to cut it: the
// tokens decoded so far are staged under `__generation_cut__/<rollout>/<model_call_id>` and the
// call keeps decoding. After a crash, the replacement's call arrives with `ng_capture.generation_cut`
// naming that staged prefix; if it checks out (same staging key and digest, same rollout, a policy
// version not newer than ours, the same prompt tokens) only the rest is decoded.
import { randomBytes } from 'node:crypto';
import { parseCaptureKey } from '../../protocol/ids.js';
import {
  cutStagingKey,
  GenerationCutContinuationSchema,
  inventoryDigest,
  prefixDigest,
  type GenerationCutInventory,
  type GenerationCutReceipt,
} from '../model/cut-wire.js';
import type { PolicyDecision } from './policy.js';
import { fakeTokenIds } from './reply.js';

export const BACKEND_SNAPSHOT_ID = 'tiny-policy-cut-store';
/** Staged prefixes kept (oldest dropped first): the store lives in memory, as the backend does. */
const MAX_STAGED = 100_000;

/** A captured call while it decodes. */
export interface ActiveGeneration {
  rolloutId: string;
  attempt: number;
  modelCallId: string;
  decision: PolicyDecision;
  promptTokenIds: number[];
  /** The completion's tokens (one per character). */
  tokens: readonly string[];
  /** Tokens decoded so far (a continuation starts at its reused prefix). */
  generated: number;
  outputLimit: number;
}

export interface StagedPrefix {
  staging_key: string;
  rollout_id: string;
  attempt: number;
  model_call_id: string;
  prompt_token_ids: number[];
  token_ids: number[];
  logprobs: number[];
  version: number;
  prefix_digest: string;
  decision: PolicyDecision;
}

export type ContinuationCheck = { ok: true; prefix: StagedPrefix } | { ok: false; reason: string };

const sameIds = (a: readonly number[], b: readonly number[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

export class CutService {
  private readonly active = new Map<string, ActiveGeneration>();
  private readonly staged = new Map<string, StagedPrefix>();
  /** One list per cut round: the model call IDs cut durably (`GET /_ctl/cuts`). */
  readonly rounds: string[][] = [];

  begin(gen: ActiveGeneration): void {
    this.active.set(gen.modelCallId, gen);
  }

  finish(modelCallId: string): void {
    this.active.delete(modelCallId);
  }

  stagedPrefix(key: string): StagedPrefix | undefined {
    return this.staged.get(key);
  }

  /** Stages the prefix of every inventoried call that is still decoding; acks every ticket once. */
  cut(inv: GenerationCutInventory): GenerationCutReceipt {
    const durable: string[] = [];
    const prefixes = inv.active_prefixes.map((p) => {
      const ident = { ticket_id: p.ticket_id, rollout_id: p.rollout_id, attempt: p.attempt, model_call_id: p.model_call_id, admitted_at: p.admitted_at };
      const gen = this.active.get(p.model_call_id);
      if (!gen || gen.rolloutId !== p.rollout_id || gen.attempt !== p.attempt || gen.generated === 0) {
        return { ...ident, disposition: 'durable_failure' as const };
      }
      const staged = this.stage(gen);
      durable.push(p.model_call_id);
      return {
        ...ident,
        disposition: 'durable_prefix' as const,
        cut_kind: 'active_prefix',
        frozen_buffer_id: randomBytes(8).toString('hex'),
        staging_keys: [staged.staging_key],
        prefix_token_count: staged.token_ids.length,
        prefix_digest: staged.prefix_digest,
        effective_output_limit: gen.outputLimit,
        terminal_finish_reason: null,
        terminal_stop_reason: null,
      };
    });
    this.rounds.push(durable);
    return {
      checkpoint_id: inv.checkpoint_id,
      cut_id: randomBytes(16).toString('hex'),
      inventory_digest: inv.inventory_digest,
      inventory: inv,
      backend_snapshot_id: BACKEND_SNAPSHOT_ID,
      prefixes,
    };
  }

  private stage(gen: ActiveGeneration): StagedPrefix {
    const tokens = gen.tokens.slice(0, gen.generated);
    const ids = fakeTokenIds(tokens.join(''));
    const key = cutStagingKey(gen.rolloutId, gen.modelCallId);
    const staged: StagedPrefix = {
      staging_key: key,
      rollout_id: gen.rolloutId,
      attempt: gen.attempt,
      model_call_id: gen.modelCallId,
      prompt_token_ids: gen.promptTokenIds,
      token_ids: ids,
      // The action's logprob sits on the first token (reply.ts).
      logprobs: ids.map((_, i) => (i === 0 ? gen.decision.logprob : 0)),
      version: gen.decision.version,
      prefix_digest: prefixDigest(gen.promptTokenIds, ids),
      decision: gen.decision,
    };
    this.staged.delete(key);
    this.staged.set(key, staged);
    if (this.staged.size > MAX_STAGED) this.staged.delete(this.staged.keys().next().value!);
    return staged;
  }

  /** Whether a call may continue the staged prefix its `ng_capture.generation_cut` names. */
  checkContinuation(raw: unknown, call: { rolloutId: string; promptTokenIds: readonly number[]; version: number }): ContinuationCheck {
    const parsed = GenerationCutContinuationSchema.safeParse(raw);
    if (!parsed.success) return { ok: false, reason: `malformed continuation: ${parsed.error.issues[0]?.message ?? 'invalid'}` };
    const c = parsed.data;
    const missing = c.staging_keys.filter((k) => !this.staged.has(k));
    if (missing.length) return { ok: false, reason: `unknown staging key ${missing[0]}` };
    const p = this.staged.get(c.staging_keys[0]!)!;
    if (p.model_call_id !== c.source_model_call_id) return { ok: false, reason: 'the staged prefix belongs to another model call' };
    if (parseCaptureKey(c.source_capture_key)?.rollout_id !== p.rollout_id || p.rollout_id !== call.rolloutId) {
      return { ok: false, reason: 'the staged prefix belongs to another rollout' };
    }
    if (p.prefix_digest !== c.prefix_digest || p.token_ids.length !== c.prefix_token_count) return { ok: false, reason: 'prefix digest or length differs' };
    if (p.version > call.version) return { ok: false, reason: `the prefix's policy version ${p.version} is newer than ours (${call.version})` };
    if (!sameIds(p.prompt_token_ids, call.promptTokenIds)) return { ok: false, reason: 'the prefix was built on other prompt tokens' };
    return { ok: true, prefix: p };
  }

  reset(): void {
    this.rounds.length = 0;
  }
}

/** The inventory's digest as the sender should have computed it. */
export function inventoryDigestMatches(inv: GenerationCutInventory): boolean {
  return inventoryDigest(inv) === inv.inventory_digest;
}
