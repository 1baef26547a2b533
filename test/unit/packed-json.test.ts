// The compact JSON the training run carries across continue-as-new and sends its ledger in
// (one Temporal payload is at most 2 MiB): lossless against JSON.stringify/parse, and small.
import { describe, expect, it } from 'vitest';
import { isPackedJson, packJson, unpackJson } from '../../protocol/packed-json.js';
import { packRunState, unpackRunState } from '../../workflows/run/codec.js';
import { initialState, type RunState } from '../../workflows/run/state.js';
import * as L from '../../workflows/ledger.js';
import { rolloutWorkflowId } from '../../workflows/rolloutAttempt.js';
import { runConfig } from '../workflows/harness.js';

const viaJson = (v: unknown): unknown => JSON.parse(JSON.stringify(v));

describe('packJson / unpackJson', () => {
  it.each([
    ['scalars', [0, -0.5, 1e21, 2 ** 53 + 2, 'text', '', true, false, null]],
    ['nested', { a: { b: [1, { c: 'd' }], e: [] }, f: {}, g: 'a', h: 'a' }],
    ['JSON edge cases', { u: undefined, n: NaN, inf: -Infinity, arr: [undefined, () => 1, NaN], d: new Date(0), ['__proto__']: { p: 1 } }],
    ['key order and numeric keys', { z: 1, '2': 2, a: 3, '10': 4 }],
  ])('%s: the same value JSON gives', (_name, value) => {
    const packed = packJson(value);
    expect(isPackedJson(packed)).toBe(true);
    const back = unpackJson(viaJson(packed) as never); // it travels as JSON
    expect(JSON.stringify(back)).toBe(JSON.stringify(value));
    expect(back).toEqual(viaJson(value));
  });

  it('keeps `__proto__` an own key, not the prototype', () => {
    const value = JSON.parse('{"__proto__": {"polluted": true}}') as object;
    const back = unpackJson(packJson(value)) as Record<string, unknown>;
    expect(Object.getPrototypeOf(back)).toBe(Object.prototype);
    expect(Object.keys(back)).toEqual(['__proto__']);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('refuses a malformed packing', () => {
    expect(() => unpackJson({ packed: 1, strings: [], shapes: [], root: 3 })).toThrow(/no string 3/);
    expect(() => unpackJson({ packed: 1, strings: [], shapes: [], root: [5, 1] })).toThrow(/bad shape/);
  });
});

describe('packRunState / unpackRunState', () => {
  /** A run with `groups` groups of 4 reserved and every sibling in flight (attempts 0–2). */
  function stateWith(groups: number): RunState {
    const config = runConfig('pack');
    const st = initialState(config);
    for (let p = 0; p < groups; p++) {
      const g = L.reserveGroup(st.ledger, {
        group_id: `${config.run.name}.p${p}`,
        prompt_id: `prompt-${p}`,
        task_source: 'counter',
        environment: 'counter_env',
        recovery_granularity: 'sibling',
        restore_level: 'turn',
        target_step: Math.floor(p / 8),
        tasks: [],
        size: 4,
      } as never);
      for (const s of g.siblings) {
        const episode = { rollout_id: s.rollout_id, attempt: (p + s.generation_index) % 3 };
        const key = episode.attempt ? `${episode.rollout_id}-a${episode.attempt}` : episode.rollout_id;
        st.inFlight[key] = {
          episode,
          groupId: g.group_id,
          environment: 'counter_env',
          workflowId: rolloutWorkflowId(config.run.name, episode),
          stopSignalled: p % 5 === 0,
        };
      }
    }
    return st;
  }

  it('round-trips the state, derived in-flight fields rebuilt, odd ones kept', () => {
    const st = stateWith(75);
    // One entry whose fields are not what its ID says: carried as is.
    const odd = Object.keys(st.inFlight)[7]!;
    st.inFlight[odd]!.workflowId = 'elsewhere';
    const back = unpackRunState(viaJson(packRunState(st, 'pack')) as never, 'pack');
    expect(back).toEqual(viaJson(st));
  });

  it('is a fraction of the plain JSON: 4,000 in flight fit one payload', () => {
    const st = stateWith(1000);
    const plain = JSON.stringify(st).length;
    const packed = JSON.stringify(packRunState(st, 'pack')).length;
    expect(packed).toBeLessThan(plain / 3);
    expect(packed).toBeLessThan(1_500_000);
  });
});
