// Generation-cut wire shapes (servers/model/cut-wire.ts, participants.md §5.6): the inventory and
// its digest, and the strict receipt check (exact echo, each ticket acked once with the same
// identity, exactly the fields each disposition allows).
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { canonicalJson } from '../../protocol/canonical-json.js';
import { buildInventory, cutStagingKey, InvalidReceiptError, validateReceipt, type ActivePrefix } from '../../servers/model/cut-wire.js';

const p = (ticket: string, call: string, extra: Partial<ActivePrefix> = {}): ActivePrefix => ({
  ticket_id: ticket,
  rollout_id: 'wx-17',
  attempt: 0,
  model_call_id: call,
  admitted_at: 1767225600.25,
  ...extra,
});

const inv = buildInventory('c1', 'policy_model', [p('b'.repeat(32), 'c3'), p('a'.repeat(32), 'c2')]);
const ident = (x: ActivePrefix) => ({ ...x });
const durable = (x: ActivePrefix, extra: Record<string, unknown> = {}) => ({
  ...ident(x),
  disposition: 'durable_prefix',
  cut_kind: 'active_prefix',
  frozen_buffer_id: 'f3',
  staging_keys: [cutStagingKey(x.rollout_id, x.model_call_id)],
  prefix_token_count: 5,
  prefix_digest: 'e'.repeat(64),
  effective_output_limit: 1024,
  terminal_finish_reason: null,
  terminal_stop_reason: null,
  ...extra,
});
const failure = (x: ActivePrefix) => ({ ...ident(x), disposition: 'durable_failure' });
const receipt = (prefixes: unknown[], over: Record<string, unknown> = {}) => ({
  checkpoint_id: 'c1',
  cut_id: 'b7',
  inventory_digest: inv.inventory_digest,
  inventory: structuredClone(inv),
  backend_snapshot_id: 'x',
  prefixes,
  ...over,
});
const [first, second] = [inv.active_prefixes[0]!, inv.active_prefixes[1]!];

describe('inventory', () => {
  it('sorts prefixes by ticket_id and digests the canonical JSON of its three fields', () => {
    expect(inv.active_prefixes.map((x) => x.model_call_id)).toEqual(['c2', 'c3']);
    const want = createHash('sha256')
      .update(canonicalJson({ checkpoint_id: 'c1', server_name: 'policy_model', active_prefixes: inv.active_prefixes }))
      .digest('hex');
    expect(inv.inventory_digest).toBe(want);
  });
});

describe('receipt validation', () => {
  it('accepts a receipt acking every ticket once (in any order)', () => {
    const out = validateReceipt(inv, receipt([failure(second), durable(first)]));
    expect(out).toEqual([
      { ticket_id: second.ticket_id, disposition: 'durable_failure' },
      {
        ticket_id: first.ticket_id,
        disposition: 'durable_prefix',
        continuation: {
          staging_keys: ['__generation_cut__/wx-17/c2'],
          prefix_token_count: 5,
          prefix_digest: 'e'.repeat(64),
          effective_output_limit: 1024,
          terminal_finish_reason: null,
          terminal_stop_reason: null,
        },
      },
    ]);
    expect(
      validateReceipt(
        inv,
        receipt([durable(first, { cut_kind: 'terminal_completion', terminal_finish_reason: 'length', terminal_stop_reason: 7 }), failure(second)]),
      ),
    ).toHaveLength(2);
  });

  it.each<[string, unknown]>([
    ['another checkpoint', receipt([durable(first), failure(second)], { checkpoint_id: 'c2' })],
    ['a wrong digest', receipt([durable(first), failure(second)], { inventory_digest: 'f'.repeat(64) })],
    ['an echo that differs', receipt([durable(first), failure(second)], { inventory: { ...inv, server_name: 'x' } })],
    ['a missing ack', receipt([durable(first)])],
    ['a duplicate ack', receipt([durable(first), failure(second), failure(second)])],
    ['an unknown ticket', receipt([durable(first), failure(second), failure(p('c'.repeat(32), 'c9'))])],
    ['a changed identity', receipt([durable({ ...first, admitted_at: 1 }), failure(second)])],
    ['a failure with durable fields', receipt([durable(first), { ...failure(second), staging_keys: ['x'] }])],
    ['no cut_kind', receipt([durable(first, { cut_kind: undefined }), failure(second)])],
    ['empty staging_keys', receipt([durable(first, { staging_keys: [] }), failure(second)])],
    ['duplicate staging_keys', receipt([durable(first, { staging_keys: ['a', 'a'] }), failure(second)])],
    ['a short prefix_digest', receipt([durable(first, { prefix_digest: 'abc' }), failure(second)])],
    ['an output limit of 0', receipt([durable(first, { effective_output_limit: 0 }), failure(second)])],
    ['a stop reason without finish reason', receipt([durable(first, { terminal_stop_reason: 'eos' }), failure(second)])],
    ['an unknown finish reason', receipt([durable(first, { terminal_finish_reason: 'tool_calls' }), failure(second)])],
    ['an unknown disposition', receipt([{ ...durable(first), disposition: 'maybe' }, failure(second)])],
    ['not an object', 'nope'],
  ])('refuses %s', (_what, body) => {
    expect(() => validateReceipt(inv, body)).toThrow(InvalidReceiptError);
  });
});
