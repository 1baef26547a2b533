// Pure parts of the agent: chat conversion, activation indices, loop state, the turn loop with
// fake calls, and the tool base URL rule.
import { describe, expect, it } from 'vitest';
import { ProtocolError } from '../../protocol/errors.js';
import { decideActivation, invocationId, parseActivationIndex } from '../../servers/agent/activation-index.js';
import { fromChatCompletion, toChatMessages, toChatTools, type ModelTurn } from '../../servers/agent/chat-format.js';
import { freshLoopState, pendingCalls, pinBoundary } from '../../servers/agent/loop-state.js';
import { callTool, chatBody, toolBaseUrl } from '../../servers/agent/peers.js';
import { parseRecord, recordTexts, restoredSession, sessionRecord } from '../../servers/agent/records.js';
import { hasJsonText } from '../../protocol/json-text.js';
import { newSession } from '../../servers/agent/sessions.js';
import { runTurnLoop } from '../../servers/agent/turn-loop.js';
import { AgentOptionsSchema } from '../../servers/agent/options.js';
import { AgentCore } from '../../servers/agent/core.js';
import { fullParticipantHooks } from '../../servers/agent/participant.js';
import type { FunctionCallItem } from '../../servers/agent/wire.js';
import { sleep } from '../helpers/wait.js';

function completion(message: Record<string, unknown>, finish = 'stop', extra: Record<string, unknown> = {}) {
  return { id: 'c1', object: 'chat.completion', created: 1, model: 'm', choices: [{ index: 0, message, finish_reason: finish }], ...extra };
}

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return err instanceof ProtocolError ? err.code : 'other';
  }
  return undefined;
}

describe('chat format', () => {
  it('groups a model turn into one assistant message and maps developer to system', () => {
    const msgs = toChatMessages(
      [
        { role: 'developer', content: 'sys' },
        {
          type: 'message',
          role: 'user',
          content: [
            { type: 'input_text', text: 'hi ' },
            { type: 'input_text', text: 'there' },
          ],
        },
      ],
      [
        { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'let me look' }] },
        { type: 'function_call', call_id: 'a', name: 'f', arguments: '{}' },
        { type: 'function_call', call_id: 'b', name: 'g', arguments: '{"x":1}' },
        { type: 'function_call_output', call_id: 'a', output: 'A' },
        { type: 'function_call_output', call_id: 'b', output: 'B' },
        { type: 'reasoning', summary: [] },
        { type: 'function_call', call_id: 'c', name: 'f', arguments: '{}' },
      ],
    );
    expect(msgs).toEqual([
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'hi there' },
      {
        role: 'assistant',
        content: 'let me look',
        tool_calls: [
          { id: 'a', type: 'function', function: { name: 'f', arguments: '{}' } },
          { id: 'b', type: 'function', function: { name: 'g', arguments: '{"x":1}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'a', content: 'A' },
      { role: 'tool', tool_call_id: 'b', content: 'B' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] },
    ]);
    expect(toChatMessages('just text', [])).toEqual([{ role: 'user', content: 'just text' }]);
    expect(codeOf(() => toChatMessages([42], []))).toBe('invalid_request');
  });

  it('converts function tools and drops other tool types', () => {
    expect(toChatTools([{ type: 'function', name: 'f', parameters: { type: 'object' } }, { type: 'web_search' }])).toEqual([
      { type: 'function', function: { name: 'f', parameters: { type: 'object' } } },
    ]);
    expect(toChatTools(undefined)).toEqual([]);
    expect(codeOf(() => toChatTools([{ type: 'function' }]))).toBe('invalid_request');
  });

  it('reads a chat completion into Responses-style items', () => {
    const t = fromChatCompletion(
      completion({ role: 'assistant', content: 'ok', tool_calls: [{ id: '', type: 'function', function: { name: 'f', arguments: '{}' } }] }, 'tool_calls', {
        usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
        ng_policy: { situation: 's', action: 'a', logprob: -0.1, version: 1 },
      }),
      2,
    );
    expect(t.items).toEqual([
      {
        type: 'message',
        role: 'assistant',
        content: [{ type: 'output_text', text: 'ok' }],
        ng_policy: { situation: 's', action: 'a', logprob: -0.1, version: 1 },
      },
      { type: 'function_call', call_id: 'call_2_0', name: 'f', arguments: '{}' },
    ]);
    expect(t.usage).toEqual({ input_tokens: 3, output_tokens: 2, total_tokens: 5 });
    expect(t.incomplete).toBeNull();
    expect(fromChatCompletion(completion({ role: 'assistant', content: 'cut' }, 'length'), 1).incomplete).toEqual({ reason: 'max_output_tokens' });
    expect(fromChatCompletion(completion({ role: 'assistant', content: '' }), 1).incomplete).toEqual({ reason: 'empty_answer' });
    expect(() => fromChatCompletion({ nope: true }, 1)).toThrow(/not a chat completion/);
  });

  it('builds the chat body with the policy model name and optional sampling knobs', () => {
    expect(chatBody({ messages: [{ role: 'user', content: 'x' }], tools: [], params: { input: 'x', temperature: 0.5, max_output_tokens: 9 } })).toEqual({
      model: 'policy',
      messages: [{ role: 'user', content: 'x' }],
      temperature: 0.5,
      max_tokens: 9,
    });
  });
});

describe('activation index', () => {
  const base = { activations: 1, completedActivation: 1, hasCompletedReply: true, runningIndex: undefined };

  it('parses the header', () => {
    expect(parseActivationIndex(undefined)).toBeUndefined();
    expect(parseActivationIndex('3')).toBe(3);
    for (const bad of ['0', '-1', '1.5', 'x', ''])
      expect(
        codeOf(() => parseActivationIndex(bad)),
        bad,
      ).toBe('activation_out_of_order');
  });

  it('decides replay, run, wait and out of order', () => {
    expect(decideActivation(base, 1)).toEqual({ kind: 'replay' });
    expect(decideActivation(base, 2)).toEqual({ kind: 'run', index: 2 });
    expect(decideActivation(base, 3).kind).toBe('out_of_order');
    expect(decideActivation({ ...base, hasCompletedReply: false }, 1).kind).toBe('out_of_order');
    expect(decideActivation({ ...base, completedActivation: 0, activations: 0, hasCompletedReply: false }, 1)).toEqual({ kind: 'run', index: 1 });
    expect(decideActivation({ ...base, completedActivation: 0, hasCompletedReply: false }, 0).kind).toBe('out_of_order');
    expect(decideActivation({ ...base, activations: 2, runningIndex: 2 }, 2)).toEqual({ kind: 'wait' });
    expect(decideActivation({ ...base, activations: 2, runningIndex: 2 }, undefined)).toEqual({ kind: 'busy' });
    expect(decideActivation(base, undefined)).toEqual({ kind: 'run', index: 2 });
    expect([1, 2, 3].map(invocationId)).toEqual(['root', 'activation-2', 'activation-3']);
  });
});

describe('loop state', () => {
  it('pins a boundary that later appends do not change', () => {
    const s = freshLoopState({ session: 'c' });
    s.new_outputs.push({ type: 'function_call', call_id: 'a', name: 'f', arguments: '{}' });
    s.step = 1;
    s.pending_tools = true;
    const snap = pinBoundary(s);
    s.new_outputs.push({ type: 'function_call_output', call_id: 'a', output: 'x' });
    s.step = 2;
    s.resources_server_cookies = { session: 'd' };
    const b = snap();
    expect(b.step).toBe(1);
    expect(b.pending_tools).toBe(true);
    expect(b.new_outputs).toHaveLength(1);
    expect(b.resources_server_cookies).toEqual({ session: 'c' });
  });

  it('finds the pending calls of the last model turn', () => {
    const fc = (id: string): FunctionCallItem => ({ type: 'function_call', call_id: id, name: 'f', arguments: '{}' });
    expect(pendingCalls([fc('a'), { type: 'function_call_output', call_id: 'a', output: '' }, fc('a'), fc('b')]).map((c) => c.call_id)).toEqual(['a', 'b']);
    expect(pendingCalls([fc('a'), { type: 'function_call_output', call_id: 'a', output: '' }])).toEqual([]);
  });
});

describe('turn loop', () => {
  const turn = (items: ModelTurn['items']): ModelTurn & { cookies: Record<string, string> } => ({
    items,
    usage: { input_tokens: 1, output_tokens: 1, total_tokens: 2 },
    incomplete: null,
    response: {},
    record: {},
    cookies: {},
  });

  it('stops at max_steps after the tool round and records boundaries where the spec says', async () => {
    const boundaries: string[] = [];
    let calls = 0;
    const out = await runTurnLoop(freshLoopState(null), {
      input: 'go',
      maxSteps: 2,
      signal: new AbortController().signal,
      boundary: async (s) => void boundaries.push(`${s.step}:${s.pending_tools}`),
      callModel: async () => turn([{ type: 'function_call', call_id: `c${++calls}`, name: 'f', arguments: '{}' }]),
      callTool: async (c) => ({ output: `out-${c.call_id}`, cookies: {}, record: {} }),
    });
    expect(calls).toBe(2);
    // Before the first call; after each response with pending tools; after the first tool round.
    expect(boundaries).toEqual(['0:false', '1:true', '1:false', '2:true']);
    expect(out.state.new_outputs.map((i) => i.type)).toEqual(['function_call', 'function_call_output', 'function_call', 'function_call_output']);
    expect(out.state.usage).toEqual({ input_tokens: 2, output_tokens: 2, total_tokens: 4 });
  });

  it('a restored state with pending tools runs the tool round first, not the model call', async () => {
    const start = freshLoopState(null);
    start.step = 1;
    start.pending_tools = true;
    start.new_outputs.push({ type: 'function_call', call_id: 'c1', name: 'f', arguments: '{}' });
    const order: string[] = [];
    const out = await runTurnLoop(start, {
      input: 'go',
      maxSteps: 8,
      signal: new AbortController().signal,
      boundary: async () => undefined,
      callModel: async (messages) => {
        order.push(`model:${messages.filter((m) => m.role === 'assistant').length}`);
        return turn([{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'done' }] }]);
      },
      callTool: async (c) => {
        order.push(`tool:${c.call_id}`);
        return { output: 'x', cookies: { session: 'new' }, record: {} };
      },
    });
    expect(order).toEqual(['tool:c1', 'model:1']);
    expect(out.state.resources_server_cookies).toEqual({ session: 'new' });
  });
});

describe('tools', () => {
  it('keeps one prefix on the grant base URL, switched to the current attempt', () => {
    expect(toolBaseUrl('http://h:1/ng-rollout/r1', 'r1')).toBe('http://h:1/ng-rollout/r1');
    expect(toolBaseUrl('http://h:1/ng-rollout/r1/', 'r1-a1')).toBe('http://h:1/ng-rollout/r1-a1');
    expect(toolBaseUrl('http://h:1/', 'r1')).toBe('http://h:1/ng-rollout/r1');
    expect(toolBaseUrl('http://h:1/x', undefined)).toBe('http://h:1/x');
  });

  it('feeds bad JSON arguments and a missing grant back as error output without a call', async () => {
    const signal = new AbortController().signal;
    const call: FunctionCallItem = { type: 'function_call', call_id: 'c', name: 'f', arguments: '{oops' };
    const grant = { kind: 'direct_http' as const, name: 'g', required: true, base_url: 'http://127.0.0.1:9/ng-rollout/r', cookies: {}, headers: {} };
    const bad = await callTool({ grant, rollout: 'r', call, cookies: {}, signal });
    expect(bad.output).toMatch(/^Error: invalid JSON arguments for tool 'f'/);
    const none = await callTool({ grant: null, rollout: 'r', call: { ...call, arguments: '{}' }, cookies: {}, signal });
    expect(none.output).toBe("Error: no tool access for tool 'f'");
  });
});

describe('records', () => {
  it('round-trips a session through its record under the next attempt', () => {
    const request = {
      agent_session_id: 'agent-session-1',
      episode_id: { rollout_id: 'r', attempt: 0 },
      task_id: { taskset: 't', task_id: 'x' },
      tool_accesses: [],
      sandbox_access: null,
    };
    const s = newSession({ key: 'agent-session-1', episode: { rollout_id: 'r', attempt: 0 }, request, grant: null });
    s.activations = 1;
    const st = freshLoopState(null);
    s.boundary = pinBoundary(st);
    const rec = JSON.parse(JSON.stringify(sessionRecord(s)));
    expect(rec.session.resources_cookies).toBeNull();
    const back = restoredSession(parseRecord(rec));
    expect(back.episode).toEqual({ rollout_id: 'r', attempt: 1 });
    expect(back.request.episode_id).toEqual({ rollout_id: 'r', attempt: 1 });
    expect(back.resourcesCookies).toBeNull();
    expect(back.continuation).toEqual(st);
    expect(back.restoredPending).toBe(true);
    expect(() => parseRecord({ ...rec, boundary: { ...rec.boundary, extra: 1 } })).toThrow();
    expect(() => parseRecord({ ...rec, episode: { next: 'loop' } })).toThrow();
  });

  it("serializes a pinned boundary and the seed request once, the session's counters each time", () => {
    const request = {
      agent_session_id: 'agent-session-2',
      episode_id: { rollout_id: 'r2', attempt: 0 },
      task_id: null,
      tool_accesses: [],
      sandbox_access: null,
    };
    const s = newSession({ key: 'agent-session-2', episode: { rollout_id: 'r2', attempt: 0 }, request, grant: null });
    const st = freshLoopState(null);
    s.boundary = pinBoundary(st);
    const first = sessionRecord(s) as unknown as { boundary: unknown; session: { request: unknown; activations: number } };
    s.activations = 2;
    const second = sessionRecord(s) as unknown as typeof first;
    expect(second.boundary).toBe(first.boundary);
    expect(second.session.request).toBe(first.session.request);
    expect(second.session.activations).toBe(2);
    st.step = 1;
    s.boundary = pinBoundary(st);
    const third = JSON.parse(JSON.stringify(sessionRecord(s)));
    expect(third.boundary.step).toBe(1);
    expect(third.session.request).toEqual(request);
  });

  it('fills option defaults', () => {
    expect(AgentOptionsSchema.parse({ model: 'm' })).toEqual({
      model: 'm',
      max_steps: 8,
      checkpoint_sessions_supported: true,
      session_close_retry_window_seconds: 300,
    });
    expect(AgentOptionsSchema.safeParse({ model: 'm', maxsteps: 3 }).success).toBe(false);
  });
});

describe('parking and restored sessions (participant hooks)', () => {
  const silent = {
    info() {},
    warn() {},
    error() {},
    debug() {},
    trace() {},
    fatal() {},
    child() {
      return silent;
    },
    level: 'silent',
  } as never;

  function core(): AgentCore {
    return new AgentCore('agent', AgentOptionsSchema.parse({ model: 'm' }), 'http://127.0.0.1:9', 'secret', silent);
  }

  it('a parked wait woken by a resume that a new prepare follows stays parked', async () => {
    const c = core();
    c.gate.close();
    let woke = false;
    const wait = c.waitForResume().then(() => (woke = true));
    c.gate.reopen();
    c.gate.close(); // the next checkpoint closes admission before the waiter runs
    await sleep(20);
    expect(woke).toBe(false);
    c.gate.reopen();
    await wait;
    expect(woke).toBe(true);
  });

  it('a cancelled park ends with the cancel reason', async () => {
    const c = core();
    c.gate.close();
    const ac = new AbortController();
    const wait = c.waitForResume(ac.signal);
    ac.abort(new Error('retired'));
    await expect(wait).rejects.toThrow('retired');
  });

  it('delete_restored frees unclaimed restored sessions outside the scope; install is all or nothing', async () => {
    const c = core();
    const hooks = fullParticipantHooks(c);
    const rec = (r: string) => ({
      episode_id: { rollout_id: r, attempt: 0 },
      session_key: `agent-session-${r}`,
      session: {
        request: { agent_session_id: `agent-session-${r}`, episode_id: { rollout_id: r, attempt: 0 }, task_id: null, tool_accesses: [], sandbox_access: null },
        resources_cookies: null,
        observations: null,
        activations: 0,
        completed_activation: 0,
        completed_reply: null,
      },
      boundary: null,
      episode: null,
    });
    const manifest = {} as never;
    await expect(hooks.install({ records: [rec('a'), { ...rec('b'), boundary: { step: 'x' } }], scope: [], manifest })).rejects.toThrow();
    expect(c.sessions.size).toBe(0);
    expect(await hooks.install({ records: [rec('a'), rec('b')], scope: [], manifest })).toEqual(['a-a1', 'b-a1']);
    expect(hooks.statusExtras!()).toEqual({ accepting: true, restored_pending: ['a-a1', 'b-a1'], capabilities: { supports_continuations: true } });
    await hooks.deleteRestored!([{ rollout_id: 'a', attempt: 1 }]);
    expect([...c.sessions.values()].map((s) => s.key)).toEqual(['agent-session-a']);
    // Nothing live: a restore may still replace the unclaimed ones.
    expect(() => hooks.assertRestorable()).not.toThrow();
  });

  it("stages a waiting session's texts once its boundary stood across two scans; the export takes them", async () => {
    const c = core();
    const hooks = fullParticipantHooks(c);
    const record = {
      episode_id: { rollout_id: 'w', attempt: 0 },
      session_key: 'agent-session-w',
      session: {
        request: { agent_session_id: 'agent-session-w', episode_id: { rollout_id: 'w', attempt: 0 }, task_id: null, tool_accesses: [], sandbox_access: null },
        resources_cookies: null,
        observations: null,
        activations: 1,
        completed_activation: 0,
        completed_reply: null,
      },
      boundary: freshLoopState(null),
      episode: null,
    };
    await hooks.install({ records: [record], scope: [], manifest: {} as never });
    const [s] = [...c.sessions.values()];
    expect(s!.boundary).not.toBeNull();
    expect([...hooks.stageAhead!()]).toHaveLength(0); // first sighting
    expect(hasJsonText(s!.boundary!)).toBe(false);
    expect([...hooks.stageAhead!()]).toHaveLength(1);
    expect(hasJsonText(s!.boundary!) && hasJsonText(s!.request)).toBe(true);
    expect([...hooks.stageAhead!()]).toHaveLength(0); // made already
    const staged = recordTexts(s!, s!.boundary);
    const { records } = await hooks.export({ checkpointId: 'c', scope: null, carriedRestarts: new Set(), signal: new AbortController().signal });
    const [exported] = [...records] as unknown as { boundary: unknown; session: { request: unknown } }[];
    expect(exported!.boundary).toBe(staged.boundary);
    expect(exported!.session.request).toBe(staged.request);
  });
});
