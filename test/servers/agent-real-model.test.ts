// The agent with a real model (docs/gym-servers.md "Real model backends"): tool calls in the
// OpenAI tools format, `tool_choice` said explicitly, replies the way real models write them, and
// a clear turn outcome for every answer — no tool call, malformed arguments, a refused request —
// with `max_steps` bounding every episode. llama.cpp itself runs in test/e2e/llama/.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeDataAgent } from '../../servers/common/http-client.js';
import { fromChatCompletion, toChatTools, type ModelTurn } from '../../servers/agent/chat-format.js';
import { freshLoopState } from '../../servers/agent/loop-state.js';
import { callModel, callTool, chatBody, UpstreamError } from '../../servers/agent/peers.js';
import { runTurnLoop } from '../../servers/agent/turn-loop.js';
import { ActivationBodySchema, type FunctionCallItem } from '../../servers/agent/wire.js';

const weatherTool = {
  type: 'function',
  name: 'get_weather',
  description: 'Weather of a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } } },
};
const completion = (message: Record<string, unknown>, finish = 'stop') => ({
  id: 'c1',
  object: 'chat.completion',
  created: 1,
  model: 'm',
  choices: [{ index: 0, message, finish_reason: finish }],
});

describe('the chat request', () => {
  it('says tool_choice: auto when the task gives tools and no choice, and passes a named function in chat form', () => {
    const tools = toChatTools([weatherTool]);
    const params = ActivationBodySchema.parse({ input: 'hi' });
    expect(chatBody({ messages: [], tools, params })).toMatchObject({ tools, tool_choice: 'auto' });
    const named = ActivationBodySchema.parse({ input: 'hi', tool_choice: { type: 'function', name: 'get_weather' } });
    expect(chatBody({ messages: [], tools, params: named }).tool_choice).toEqual({ type: 'function', function: { name: 'get_weather' } });
    expect(chatBody({ messages: [], tools: [], params }).tool_choice).toBeUndefined();
    expect(ActivationBodySchema.safeParse({ input: 'hi', tool_choice: 'sometimes' }).success).toBe(false);
  });
});

describe('replies the way real models write them', () => {
  it('arguments as an object, no id, no type: still a tool call', () => {
    const t = fromChatCompletion(
      completion({ role: 'assistant', content: null, tool_calls: [{ function: { name: 'get_weather', arguments: { city: 'SF' } } }] }, 'tool_calls'),
      1,
    );
    expect(t.items).toEqual([{ type: 'function_call', call_id: 'call_1_0', name: 'get_weather', arguments: '{"city":"SF"}' }]);
    expect(t.incomplete).toBeNull();
  });

  it('an answer without a tool call ends the episode with that answer (the environment scores it)', async () => {
    const state = freshLoopState(null);
    const turn = fromChatCompletion(completion({ role: 'assistant', content: 'It is sunny, I think.' }), 1);
    let tools = 0;
    const out = await runTurnLoop(state, {
      input: 'How is the weather in SF?',
      maxSteps: 5,
      signal: new AbortController().signal,
      boundary: async () => undefined,
      callModel: async () => ({ ...turn, cookies: {} }),
      callTool: async () => {
        tools++;
        return { output: '', cookies: {}, record: {} };
      },
    });
    expect(out.incomplete).toBeNull();
    expect(out.state.step).toBe(1);
    expect(tools).toBe(0);
    expect(out.state.new_outputs).toEqual([{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'It is sunny, I think.' }] }]);
  });

  it('malformed arguments reach the model as an error output, and the episode goes on', async () => {
    const call: FunctionCallItem = { type: 'function_call', call_id: 'c0', name: 'get_weather', arguments: '{"city": "S' };
    const r = await callTool({
      grant: { kind: 'direct_http', name: 'w', required: true, base_url: 'http://127.0.0.1:9', cookies: {}, headers: {} },
      rollout: 'r',
      call,
      cookies: {},
      signal: new AbortController().signal,
    });
    expect(r.output).toMatch(/^Error: invalid JSON arguments for tool 'get_weather'/);
    expect(r.record).toMatchObject({ call_id: 'c0', status: null });
  });

  it('max_steps bounds an episode whose model calls a tool on every turn', async () => {
    let n = 0;
    const out = await runTurnLoop(freshLoopState(null), {
      input: 'go',
      maxSteps: 3,
      signal: new AbortController().signal,
      boundary: async () => undefined,
      callModel: async (): Promise<ModelTurn & { cookies: Record<string, string> }> => {
        n++;
        return {
          ...fromChatCompletion(
            completion(
              { role: 'assistant', content: null, tool_calls: [{ id: `k${n}`, type: 'function', function: { name: 'get_weather', arguments: '{}' } }] },
              'tool_calls',
            ),
            n,
          ),
          cookies: {},
        };
      },
      callTool: async () => ({ output: 'ok', cookies: {}, record: {} }),
    });
    expect(n).toBe(3);
    expect(out.state.step).toBe(3);
    expect(out.state.new_outputs.filter((i) => i.type === 'function_call_output')).toHaveLength(3);
  });
});

describe('a model server that refuses the call', () => {
  let server: Server;
  let url: string;
  let answer: { status: number; body: unknown };
  beforeAll(async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(answer.status, { 'content-type': 'application/json' }).end(JSON.stringify(answer.body)));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await new Promise((r) => server.close(r));
    await closeDataAgent();
  });
  const call = () =>
    callModel({
      modelUrl: url,
      rollout: 'r1',
      messages: [{ role: 'user', content: 'hi' }],
      tools: [],
      params: { input: 'hi' },
      cookies: {},
      step: 2,
      signal: new AbortController().signal,
    });

  it('a request the backend rejects (context too long) is the turn outcome model_rejected', async () => {
    answer = { status: 400, body: { error: { code: 'backend_rejected', detail: 'the backend answered HTTP 400: context length exceeded' } } };
    const t = await call();
    expect(t.items).toEqual([]);
    expect(t.incomplete).toEqual({ reason: 'model_rejected' });
    expect(t.record).toMatchObject({ step: 2, status: 400, error: 'the backend answered HTTP 400: context length exceeded' });
  });

  it('a refusal of the deployment (a wrong key) and a retryable failure fail the activation instead', async () => {
    answer = { status: 401, body: { error: { code: 'backend_rejected', detail: 'bad key' } } };
    await expect(call()).rejects.toBeInstanceOf(UpstreamError);
    answer = { status: 504, body: { error: { code: 'backend_timeout', detail: 'slow' } } };
    await expect(call()).rejects.toBeInstanceOf(UpstreamError);
  });
});
