// Generation-cut wire shapes (participants.md §5.6): the inventory the policy model server posts to
// its backend at prepare, the receipt the backend answers, and the continuation a restored cut
// becomes. Shared by the model participant (sender, strict receipt check) and the tiny-policy
// backend (the cut service), so both sides agree on one definition.
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { canonicalJson } from '../../protocol/canonical-json.js';

/** Where the backend serves cuts, relative to its root (the base URL without `/v1`). */
export const GENERATION_CUT_PATH = '/ng-control/v1/generation-cut';
/** Staging-key prefix of a cut prefix in the backend's store: `__generation_cut__/<rollout>/<call>`. */
export const GENERATION_CUT_STAGING_PREFIX = '__generation_cut__';

const HEX64 = /^[0-9a-f]{64}$/;

export function cutStagingKey(rolloutId: string, modelCallId: string): string {
  return `${GENERATION_CUT_STAGING_PREFIX}/${rolloutId}/${modelCallId}`;
}

export const ActivePrefixSchema = z.strictObject({
  ticket_id: z.string().min(1),
  rollout_id: z.string().min(1),
  attempt: z.number().int().min(0),
  model_call_id: z.string().min(1),
  admitted_at: z.number(),
});
export type ActivePrefix = z.infer<typeof ActivePrefixSchema>;

export const GenerationCutInventorySchema = z.strictObject({
  checkpoint_id: z.string().min(1),
  server_name: z.string().min(1),
  active_prefixes: z.array(ActivePrefixSchema),
  inventory_digest: z.string().regex(HEX64),
});
export type GenerationCutInventory = z.infer<typeof GenerationCutInventorySchema>;

/** SHA-256 hex of the canonical JSON (sorted keys, compact) of the three inventory fields. */
export function inventoryDigest(inv: Pick<GenerationCutInventory, 'checkpoint_id' | 'server_name' | 'active_prefixes'>): string {
  const body = { checkpoint_id: inv.checkpoint_id, server_name: inv.server_name, active_prefixes: inv.active_prefixes };
  return createHash('sha256').update(canonicalJson(body), 'utf8').digest('hex');
}

/** Builds an inventory: prefixes sorted by `ticket_id`, digest filled in. */
export function buildInventory(checkpointId: string, serverName: string, prefixes: readonly ActivePrefix[]): GenerationCutInventory {
  const active = [...prefixes].sort((a, b) => (a.ticket_id < b.ticket_id ? -1 : a.ticket_id > b.ticket_id ? 1 : 0));
  const inv = { checkpoint_id: checkpointId, server_name: serverName, active_prefixes: active };
  return { ...inv, inventory_digest: inventoryDigest(inv) };
}

export const TERMINAL_FINISH_REASONS = ['stop', 'length'] as const;

/** What a restored call sends its backend to continue a cut prefix (`ng_capture.generation_cut`). */
export const GenerationCutContinuationSchema = z.strictObject({
  source_capture_key: z.string().min(1),
  source_model_call_id: z.string().min(1),
  staging_keys: z.array(z.string().min(1)).min(1),
  prefix_token_count: z.number().int().min(0),
  prefix_digest: z.string().regex(HEX64),
  effective_output_limit: z.number().int().min(1),
  terminal_finish_reason: z.enum(TERMINAL_FINISH_REASONS).nullable(),
  terminal_stop_reason: z.union([z.string(), z.number()]).nullable(),
});
export type GenerationCutContinuation = z.infer<typeof GenerationCutContinuationSchema>;

/** One cut as a model record keeps it (`generation_cuts[i]`, §5.3). */
export const GenerationCutSchema = z.strictObject({
  model_call_id: z.string().min(1),
  request_digest: z.string().regex(HEX64),
  continuation: GenerationCutContinuationSchema,
});
export type GenerationCut = z.infer<typeof GenerationCutSchema>;

/** Per-call ack: identity plus either a durable prefix or a failure (checked by validateReceipt). */
export const GenerationCutPrefixAckSchema = z.looseObject({
  ticket_id: z.string(),
  rollout_id: z.string(),
  attempt: z.number(),
  model_call_id: z.string(),
  admitted_at: z.number(),
  disposition: z.enum(['durable_prefix', 'durable_failure']),
});
export type GenerationCutPrefixAck = z.infer<typeof GenerationCutPrefixAckSchema> & Record<string, unknown>;

export const GenerationCutReceiptSchema = z.looseObject({
  checkpoint_id: z.string(),
  cut_id: z.string().min(1),
  inventory_digest: z.string(),
  inventory: z.unknown(),
  backend_snapshot_id: z.string().nullable().optional(),
  prefixes: z.array(GenerationCutPrefixAckSchema),
});
export type GenerationCutReceipt = z.infer<typeof GenerationCutReceiptSchema>;

/** A durable prefix's fields; a failure must carry none of them. */
const DURABLE_FIELDS = [
  'cut_kind',
  'frozen_buffer_id',
  'staging_keys',
  'prefix_token_count',
  'prefix_digest',
  'effective_output_limit',
  'terminal_finish_reason',
  'terminal_stop_reason',
] as const;

export class InvalidReceiptError extends Error {
  constructor(message: string) {
    super(`invalid generation-cut receipt: ${message}`);
    this.name = 'InvalidReceiptError';
  }
}

export type CutOutcome =
  | { ticket_id: string; disposition: 'durable_prefix'; continuation: Omit<GenerationCutContinuation, 'source_capture_key' | 'source_model_call_id'> }
  | { ticket_id: string; disposition: 'durable_failure' };

/**
 * Strict check of a receipt against the inventory sent (§5.6): exact echo and digest, every
 * ticket acked exactly once with the same identity, and per disposition exactly the fields it
 * allows. Returns one outcome per ticket; throws InvalidReceiptError otherwise.
 */
export function validateReceipt(inv: GenerationCutInventory, raw: unknown): CutOutcome[] {
  const parsed = GenerationCutReceiptSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new InvalidReceiptError(`${issue.path.map(String).join('.') || '(body)'}: ${issue.message}`);
  }
  const r = parsed.data;
  if (r.checkpoint_id !== inv.checkpoint_id) throw new InvalidReceiptError(`checkpoint_id '${r.checkpoint_id}' is not '${inv.checkpoint_id}'`);
  if (r.inventory_digest !== inv.inventory_digest) throw new InvalidReceiptError('inventory_digest does not match the inventory sent');
  if (canonicalJson(r.inventory) !== canonicalJson(inv)) throw new InvalidReceiptError('the inventory echo differs from the inventory sent');
  const expected = new Map(inv.active_prefixes.map((p) => [p.ticket_id, p]));
  const seen = new Set<string>();
  const out: CutOutcome[] = [];
  for (const ack of r.prefixes as GenerationCutPrefixAck[]) {
    const want = expected.get(ack.ticket_id);
    if (!want) throw new InvalidReceiptError(`ack for unknown ticket ${ack.ticket_id}`);
    if (seen.has(ack.ticket_id)) throw new InvalidReceiptError(`ticket ${ack.ticket_id} acked twice`);
    seen.add(ack.ticket_id);
    if (
      ack.rollout_id !== want.rollout_id ||
      ack.attempt !== want.attempt ||
      ack.model_call_id !== want.model_call_id ||
      ack.admitted_at !== want.admitted_at
    ) {
      throw new InvalidReceiptError(`ticket ${ack.ticket_id}: identity differs from the inventory`);
    }
    if (ack.disposition === 'durable_failure') {
      const extra = DURABLE_FIELDS.filter((f) => ack[f] !== undefined && ack[f] !== null);
      if (extra.length) throw new InvalidReceiptError(`ticket ${ack.ticket_id}: durable_failure carries ${extra.join(', ')}`);
      out.push({ ticket_id: ack.ticket_id, disposition: 'durable_failure' });
      continue;
    }
    out.push({ ticket_id: ack.ticket_id, disposition: 'durable_prefix', continuation: durableFields(ack) });
  }
  if (seen.size !== expected.size) {
    const missing = [...expected.keys()].filter((k) => !seen.has(k));
    throw new InvalidReceiptError(`no ack for ticket(s) ${missing.join(', ')}`);
  }
  return out;
}

function durableFields(ack: GenerationCutPrefixAck): Omit<GenerationCutContinuation, 'source_capture_key' | 'source_model_call_id'> {
  const id = ack.ticket_id;
  const fail = (what: string): never => {
    throw new InvalidReceiptError(`ticket ${id}: durable_prefix ${what}`);
  };
  if (ack.cut_kind !== 'active_prefix' && ack.cut_kind !== 'terminal_completion') fail('needs cut_kind active_prefix or terminal_completion');
  if (typeof ack.frozen_buffer_id !== 'string' || ack.frozen_buffer_id.length === 0) fail('needs frozen_buffer_id');
  const keys = ack.staging_keys;
  if (!Array.isArray(keys) || keys.length === 0 || keys.some((k) => typeof k !== 'string' || k.length === 0)) fail('needs non-empty staging_keys');
  if (new Set(keys as string[]).size !== (keys as string[]).length) fail('has duplicate staging_keys');
  const count = ack.prefix_token_count;
  if (typeof count !== 'number' || !Number.isSafeInteger(count) || count < 0) fail('needs prefix_token_count');
  if (typeof ack.prefix_digest !== 'string' || !HEX64.test(ack.prefix_digest)) fail('needs a 64-hex prefix_digest');
  const limit = ack.effective_output_limit;
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 1) fail('needs effective_output_limit ≥ 1');
  const finish = ack.terminal_finish_reason ?? null;
  const stop = ack.terminal_stop_reason ?? null;
  if (finish !== null && !TERMINAL_FINISH_REASONS.includes(finish as never)) fail('has an unknown terminal_finish_reason');
  if (stop !== null && finish === null) fail('has terminal_stop_reason without terminal_finish_reason');
  if (stop !== null && typeof stop !== 'string' && typeof stop !== 'number') fail('has an invalid terminal_stop_reason');
  return {
    staging_keys: [...(keys as string[])],
    prefix_token_count: count as number,
    prefix_digest: ack.prefix_digest as string,
    effective_output_limit: limit as number,
    terminal_finish_reason: finish as GenerationCutContinuation['terminal_finish_reason'],
    terminal_stop_reason: stop as GenerationCutContinuation['terminal_stop_reason'],
  };
}

/** `prefix_digest` of a staged prefix: SHA-256 of the canonical `{prompt_token_ids, token_ids}`. */
export function prefixDigest(promptTokenIds: readonly number[], tokenIds: readonly number[]): string {
  return createHash('sha256')
    .update(canonicalJson({ prompt_token_ids: promptTokenIds, token_ids: tokenIds }), 'utf8')
    .digest('hex');
}
