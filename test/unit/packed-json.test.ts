// The compact JSON a rollout shard carries across continue-as-new and sends its ledger slice in:
// lossless against JSON.stringify/parse, and small.
import { describe, expect, it } from 'vitest';
import { isPackedJson, packJson, unpackJson } from '../../protocol/packed-json.js';

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
