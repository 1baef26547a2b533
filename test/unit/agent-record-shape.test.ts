// The agent's plain-code record check must never accept what the record schema refuses, and what
// it accepts must be exactly what the schema would return: checked on a written record and on
// every single-field mutation of it.
import { describe, expect, it } from 'vitest';
import { isPlainAgentRecord } from '../../servers/agent/record-shape.js';
import { AgentRecordSchema } from '../../servers/agent/records.js';

const cookie = 'eyJzZXNzaW9uX2lkIjoicmVzb3VyY2VzLXNlc3Npb24tYzkzIn0.jVcKPk0PKAjBtr5vRHl7xWelP4DAEf';
const call = {
  type: 'function_call',
  call_id: 'call_r_0',
  name: 'increment_counter',
  arguments: '{"count":2}',
  ng_policy: { logprob: -1.7338597115786891, version: 0 },
};
const usage = { input_tokens: 166, output_tokens: 11, total_tokens: 177 };

function written(): Record<string, unknown> {
  return {
    episode_id: { rollout_id: 'r-3-0', attempt: 0 },
    session_key: 'agent-session-5156',
    session: {
      request: {
        agent_session_id: 'agent-session-5156',
        episode_id: { rollout_id: 'r-3-0', attempt: 0 },
        task_id: { taskset: 'counter', task_id: 'counter-7-3' },
        tool_accesses: [
          {
            kind: 'direct_http',
            name: 'counter.direct_http',
            required: true,
            base_url: 'http://127.0.0.1:34043/ng-rollout/r-3-0',
            cookies: { session: cookie },
            headers: {},
          },
          { kind: 'mcp', name: 'search', required: false, url: 'x' },
        ],
        sandbox_access: null,
      },
      resources_cookies: { session: cookie },
      observations: { source: 'simple_agent', records: [{ step: 1 }], gaps: [] },
      activations: 1,
      completed_activation: 0,
      completed_reply: { response: { id: 'resp_1', output: [] }, cookies: { a: 'b' } },
    },
    boundary: {
      step: 1,
      pending_tools: false,
      new_outputs: [call, { type: 'function_call_output', call_id: 'call_r_0', output: '{"success":true}' }],
      usage,
      last_model_response: { id: 'chatcmpl-1', object: 'response', output: [call], usage, incomplete_details: null },
      model_server_cookies: {},
      resources_server_cookies: { session: cookie },
      turns: [{ step: 1, outputs_before: 0, outputs: 1 }],
      tool_records: [{ step: 1, call_id: 'call_r_0', name: 'increment_counter', status: 200 }],
      model_calls: [{ step: 1, response_id: 'chatcmpl-1', usage }],
      gaps: [],
    },
    episode: null,
  };
}

const REPLACEMENTS: unknown[] = [
  undefined,
  null,
  '',
  'x',
  ' http://a.b/ ',
  'http:a.b',
  'HTTPS://A.B/c',
  'ftp://a.b',
  -1,
  0,
  1.5,
  2 ** 53,
  true,
  [],
  {},
  { type: '' },
];

/** Every path to a value in `v` (object keys and array indexes). */
function paths(v: unknown, at: Array<string | number> = []): Array<Array<string | number>> {
  if (typeof v !== 'object' || v === null) return [];
  const out: Array<Array<string | number>> = [];
  for (const [k, child] of Object.entries(v)) {
    const p = [...at, Array.isArray(v) ? Number(k) : k];
    out.push(p, ...paths(child, p));
  }
  return out;
}

function mutated(path: Array<string | number>, value: unknown): Record<string, unknown> {
  const rec = written();
  let o: any = rec;
  for (const k of path.slice(0, -1)) o = o[k];
  const last = path[path.length - 1]!;
  if (value === undefined && !Array.isArray(o)) delete o[last];
  else o[last] = value;
  return rec;
}

function agrees(rec: Record<string, unknown>): boolean {
  if (!isPlainAgentRecord(rec)) return false;
  const r = AgentRecordSchema.safeParse(rec);
  expect(r.success, JSON.stringify(rec)).toBe(true);
  expect(r.data).toEqual(rec);
  return true;
}

describe('isPlainAgentRecord', () => {
  it('takes a record as the agent writes it, and the schema returns the same value', () => {
    expect(agrees(written())).toBe(true);
    const bare = written();
    bare.boundary = null;
    (bare.session as any).completed_reply = null;
    (bare.session as any).observations = null;
    (bare.session as any).resources_cookies = null;
    Object.assign((bare.session as any).request, { task_id: null, tool_accesses: [] });
    delete (bare.session as any).request.episode_id;
    expect(agrees(bare)).toBe(true);
  });

  it('never accepts a single-field change the schema refuses or would rewrite', () => {
    let accepted = 0;
    let checked = 0;
    for (const path of paths(written())) {
      for (const value of REPLACEMENTS) {
        checked++;
        if (agrees(mutated(path, value))) accepted++;
      }
      // An unknown key at that place.
      const rec = written();
      let o: any = rec;
      for (const k of path) o = o[k];
      if (typeof o === 'object' && o !== null && !Array.isArray(o)) {
        o.unexpected_key = 1;
        checked++;
        if (agrees(rec)) accepted++;
      }
    }
    // The loop must have exercised both outcomes.
    expect(checked).toBeGreaterThan(1000);
    expect(accepted).toBeGreaterThan(100);
    expect(accepted).toBeLessThan(checked);
  });
});
