// A shard's memory of the requests it holds and has answered (workflows/shard/state.ts): a request
// sent twice (a checkpoint attempt's local activity runs again on a replay) is known, so it is
// neither answered nor carried out twice; only the last ANSWERED_REQUESTS_KEPT are kept.
import { describe, expect, it } from 'vitest';
import type { ShardRequest } from '../../workflows/messages.js';
import { ANSWERED_REQUESTS_KEPT, initialShardState, knownRequest, rememberAnswered } from '../../workflows/shard/state.js';

const holds = { seq: 1, admission: ['checkpoint'], deadlines: [], reports: [] };
const request = (id: string): ShardRequest => ({ id, replyTo: 'run/checkpoint/c1', kind: 'candidates', tmpDir: '/tmp/x', holds });

describe('a shard knows the requests it holds and the ones it answered', () => {
  it('a waiting request and an answered one are known; another ID is not', () => {
    const st = initialShardState('run', { seq: 0, admission: [], deadlines: [], reports: [] });
    expect(knownRequest(st, 'c1/req-1/0')).toBe(false);
    st.requests.push(request('c1/req-1/0'));
    expect(knownRequest(st, 'c1/req-1/0')).toBe(true);
    st.requests.shift();
    rememberAnswered(st, 'c1/req-1/0');
    expect(knownRequest(st, 'c1/req-1/0')).toBe(true);
    expect(knownRequest(st, 'c1/req-2/0')).toBe(false);
  });

  it(`keeps the last ${ANSWERED_REQUESTS_KEPT} answered IDs, oldest forgotten first`, () => {
    const st = initialShardState('run', { seq: 0, admission: [], deadlines: [], reports: [] });
    for (let i = 0; i < ANSWERED_REQUESTS_KEPT + 5; i++) rememberAnswered(st, `req-${i}`);
    expect(st.answeredRequests).toHaveLength(ANSWERED_REQUESTS_KEPT);
    expect(knownRequest(st, 'req-4')).toBe(false);
    expect(knownRequest(st, 'req-5')).toBe(true);
    expect(knownRequest(st, `req-${ANSWERED_REQUESTS_KEPT + 4}`)).toBe(true);
  });
});
