// Lineage from requests (servers/model/conversation.ts): parent resolution by the fingerprint of
// model-authored turns plus the recorded context being a prefix of the new request, the request
// digest restored cuts are matched by, and the constrained-decoding exclusion (§5.5).
import { describe, expect, it } from 'vitest';
import { constrainedDecoding, normalizeMessage, requestContext, resolveParent, turnFingerprint, type LineageRow } from '../../servers/model/conversation.js';

const sys = { role: 'system', content: 'You are helpful.' };
const user = { role: 'user', content: 'Count.\n[task counter start=3 target=6]' };
const call = (n: number, args: string) => ({
  role: 'assistant',
  content: null,
  tool_calls: [{ id: `call_${n}`, type: 'function', function: { name: 'increment_counter', arguments: args } }],
});
const tool = (n: number) => ({ role: 'tool', tool_call_id: `call_${n}`, content: '{"count":4}' });

/** The row a call over `messages` with output `out` gets. */
function rowOf(id: string, messages: unknown[], out: unknown, withOutput = true): LineageRow {
  const ctx = requestContext({ messages });
  return {
    model_call_id: id,
    fingerprint: ctx.fingerprint,
    context_len: ctx.context_len,
    context_digest: ctx.context_digest,
    output_fingerprint: withOutput ? turnFingerprint(normalizeMessage(out)) : null,
  };
}

describe('parent resolution', () => {
  const m0 = [sys, user];
  const out0 = call(0, '{"count":1}');
  const m1 = [...m0, out0, tool(0)];
  const out1 = call(1, '{"count":2}');
  const m2 = [...m1, out1, tool(1)];

  it('a first call has no parent; a later call finds the call whose output it carries', () => {
    const rows = [rowOf('c0', m0, out0), rowOf('c1', m1, out1)];
    expect(resolveParent(rows, requestContext({ messages: m0 }))).toBeNull();
    expect(resolveParent(rows, requestContext({ messages: m1 }))).toBe('c0');
    expect(resolveParent(rows, requestContext({ messages: m2 }))).toBe('c1');
  });

  it('survives the agent rebuilding the assistant turn (content "" vs null, other ids)', () => {
    const rows = [rowOf('c0', m0, out0)];
    const rebuilt = [
      ...m0,
      { role: 'assistant', content: '', tool_calls: [{ id: 'other', type: 'function', function: { name: 'increment_counter', arguments: '{"count":1}' } }] },
      tool(0),
    ];
    expect(resolveParent(rows, requestContext({ messages: rebuilt }))).toBe('c0');
  });

  it('no parent when the model turn differs, the context differs, or the row is of another conversation', () => {
    const rows = [rowOf('c0', m0, out0)];
    expect(resolveParent(rows, requestContext({ messages: [...m0, call(0, '{"count":3}'), tool(0)] }))).toBeNull();
    expect(resolveParent(rows, requestContext({ messages: [{ ...sys, content: 'other' }, user, out0, tool(0)] }))).toBeNull();
    expect(resolveParent([], requestContext({ messages: m1 }))).toBeNull();
  });

  it('a row without output fingerprint (a streamed call) still matches by its context; the latest wins', () => {
    const rows = [rowOf('c0', m0, out0, false), rowOf('c0-retry', m0, out0, false)];
    expect(resolveParent(rows, requestContext({ messages: m1 }))).toBe('c0-retry');
  });
});

describe('request digest and constrained decoding', () => {
  it('the same conversation and tools give the same digest; tools count', () => {
    const a = requestContext({ messages: [sys, user], tools: [{ type: 'function', function: { name: 't' } }] });
    const b = requestContext({ messages: [sys, user], tools: [{ type: 'function', function: { name: 't' } }], temperature: 1 });
    const c = requestContext({ messages: [sys, user] });
    expect(a.request_digest).toBe(b.request_digest);
    expect(a.request_digest).not.toBe(c.request_digest);
    expect(a.request_digest).toMatch(/^[0-9a-f]{64}$/);
  });

  it('constrained requests are named (§5.5)', () => {
    expect(constrainedDecoding({ messages: [] })).toBeUndefined();
    expect(constrainedDecoding({ tool_choice: 'auto' })).toBeUndefined();
    expect(constrainedDecoding({ tool_choice: 'none', response_format: { type: 'text' } })).toBeUndefined();
    expect(constrainedDecoding({ tool_choice: 'required' })).toBe('tool_choice');
    expect(constrainedDecoding({ tool_choice: { type: 'function', function: { name: 'x' } } })).toBe('tool_choice');
    expect(constrainedDecoding({ response_format: { type: 'json_object' } })).toBe('response_format');
    expect(constrainedDecoding({ guided_regex: 'a+' })).toBe('guided_regex');
    expect(constrainedDecoding({ structured_outputs: { json: {} } })).toBe('structured_outputs');
  });
});
