import { describe, expect, it } from 'vitest';
import { jsonKernelsAvailable } from '../../protocol/json-kernels.js';
import {
  JsonLineEncoder,
  LosslessJsonError,
  type LosslessValue,
  LosslessNumber,
  OrderedObject,
  parseLossless,
  parseLosslessSlow,
  jsonTextOfUtf8,
  stringifyLossless,
} from '../../protocol/lossless-json.js';
import { toPlainJson } from '../../protocol/lossless-json.js';
import { JsonText } from '../../protocol/json-text.js';

/** A structural description with types (number vs bigint vs LosslessNumber, plain vs ordered). */
function tag(v: unknown): string {
  if (v instanceof LosslessNumber) return `L(${v.raw})`;
  if (typeof v === 'bigint') return `B(${v})`;
  if (typeof v === 'number') return Object.is(v, -0) ? 'N(-0)' : `N(${v})`;
  if (v instanceof OrderedObject) return `O{${[...v].map(([k, x]) => `${JSON.stringify(k)}:${tag(x)}`).join(',')}}`;
  if (Array.isArray(v)) return `[${v.map(tag).join(',')}]`;
  if (v && typeof v === 'object') {
    const proto = Object.getPrototypeOf(v) === Object.prototype ? '' : '!proto';
    return `P{${Object.keys(v)
      .map((k) => `${JSON.stringify(k)}:${tag((v as Record<string, unknown>)[k])}`)
      .join(',')}${proto}}`;
  }
  return JSON.stringify(v);
}

function seeded(seed: number): () => number {
  return () => {
    seed = (Math.imul(seed, 1103515245) + 12345) & 0x7fffffff;
    return seed / 0x7fffffff;
  };
}

function encodeLines(values: unknown[], batchBytes?: number): Buffer {
  const chunks: Buffer[] = [];
  const enc = new JsonLineEncoder((c) => chunks.push(Buffer.from(c)), batchBytes);
  for (const v of values) enc.writeLine(v);
  enc.flush();
  return Buffer.concat(chunks);
}

describe('parseLossless / stringifyLossless', () => {
  it('keeps integers of any size as bigint and writes them exactly', () => {
    const text = '{"a":1180591620717411303424,"b":-1180591620717411303424,"c":9007199254740993,"d":9007199254740991}';
    const v = parseLossless(text) as Record<string, unknown>;
    expect(v.a).toBe(2n ** 70n);
    expect(v.b).toBe(-(2n ** 70n));
    expect(v.c).toBe(9007199254740993n);
    expect(v.d).toBe(9007199254740991);
    expect(stringifyLossless(v)).toBe(text);
    expect(stringifyLossless({ x: 2n ** 70n })).toBe('{"x":1180591620717411303424}');
  });

  it('reads and writes NaN, Infinity and -Infinity', () => {
    const v = parseLossless('{"a":NaN,"b":Infinity,"c":-Infinity,"d":[NaN, -Infinity]}') as Record<string, unknown>;
    expect(v.a).toBeNaN();
    expect(v.b).toBe(Infinity);
    expect(v.c).toBe(-Infinity);
    expect(stringifyLossless(v)).toBe('{"a":NaN,"b":Infinity,"c":-Infinity,"d":[NaN,-Infinity]}');
    expect(stringifyLossless([Number.NaN, -Infinity])).toBe('[NaN,-Infinity]');
  });

  it('keeps number text JS would print differently (1.0, 1e+16) verbatim', () => {
    for (const raw of ['1.0', '1e+16', '1E5', '-0.0', '1.50', '0.10000000000000001', '1e-07', '1e400']) {
      const v = parseLossless(`[${raw}]`) as unknown[];
      expect(v[0]).toBeInstanceOf(LosslessNumber);
      expect((v[0] as LosslessNumber).raw).toBe(raw);
      expect(stringifyLossless(v)).toBe(`[${raw}]`);
    }
    expect(+(parseLossless('1.0') as LosslessNumber)).toBe(1);
    expect((parseLossless('1e+16') as LosslessNumber).valueOf()).toBe(1e16);
    // Text JS prints back identically stays a plain number.
    for (const raw of ['0', '1.5', '0.1', '0.30000000000000004', '-3', '1e-7', '1e+21', '5e-324', '123456789012345']) {
      expect(typeof parseLossless(raw)).toBe('number');
    }
    expect(() => new LosslessNumber('1.')).toThrow(LosslessJsonError);
  });

  it('writes -0 with its sign', () => {
    expect(stringifyLossless({ z: -0 })).toBe('{"z":-0}');
    expect(Object.is(parseLossless('-0'), -0)).toBe(true);
  });

  it('keeps key order, including integer-like keys a JS object would move', () => {
    const text = '{"b":1,"2":{"10":1,"9":2,"x":3},"a":[{"z":1,"0":2}],"1":null}';
    const v = parseLossless(text);
    expect(v).toBeInstanceOf(OrderedObject);
    expect([...(v as OrderedObject).keys()]).toEqual(['b', '2', 'a', '1']);
    expect(stringifyLossless(v)).toBe(text);
    // Array-index keys already first and ascending need no wrapper.
    const plain = parseLossless('{"0":1,"1":2,"x":3,"4294967295":4}');
    expect(plain).not.toBeInstanceOf(OrderedObject);
    expect(stringifyLossless(plain)).toBe('{"0":1,"1":2,"x":3,"4294967295":4}');
    expect((v as OrderedObject).toPlain()).toMatchObject({ b: 1, a: [expect.anything()] });
    // Any Map with string keys is written as an object in its own order.
    expect(
      stringifyLossless(
        new Map<string, unknown>([
          ['b', 1],
          ['2', 2],
        ]),
      ),
    ).toBe('{"b":1,"2":2}');
  });

  it('round-trips nested values and unicode', () => {
    const text = '{"episode_id":{"rollout_id":"r","attempt":3},"s":"é東😀\u2028\\"\\\\\\n\\t\\u0000","deep":[[[{"k":[1,2,{"m":true}]}]]],"n":null}';
    const v = parseLossless(text) as Record<string, unknown>;
    expect(v.s).toBe('é東😀\u2028"\\\n\t\u0000');
    expect(stringifyLossless(v)).toBe(text);
    expect(stringifyLossless(parseLossless(stringifyLossless(v)))).toBe(text);
  });

  it('reads Python-style text (spaces, \\u escapes, lone surrogates) to the same values', () => {
    const py = '{"episode_id": {"rollout_id": "r", "attempt": 1}, "t": "caf\\u00e9 \\ud83d\\ude00 \\ud800", "x": [1.0, 2, NaN]}';
    const v = parseLossless(py) as Record<string, unknown>;
    expect(v.t).toBe('café 😀 \ud800');
    expect(stringifyLossless(v)).toBe('{"episode_id":{"rollout_id":"r","attempt":1},"t":"café 😀 \\ud800","x":[1.0,2,NaN]}');
  });

  it('keeps a "__proto__" key as data', () => {
    const v = parseLossless('{"__proto__":{"polluted":true},"a":1}') as Record<string, unknown>;
    expect(Object.keys(v)).toEqual(['__proto__', 'a']);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(stringifyLossless(v)).toBe('{"__proto__":{"polluted":true},"a":1}');
    const slow = parseLossless('{"__proto__":1,"a":NaN}') as Record<string, unknown>;
    expect(Object.keys(slow)).toEqual(['__proto__', 'a']);
  });

  it('refuses invalid JSON', () => {
    for (const bad of ['', '{"a":1,}', '[1,]', '{a:1}', '01', '"\t"', 'nul', '[1 2]', '{"a":1}x', '"abc', '-', 'NaNx', '1.', '.5', '+1', '\ufeff{}']) {
      expect(() => parseLossless(bad), bad).toThrow(LosslessJsonError);
      expect(() => parseLosslessSlow(bad), bad).toThrow(LosslessJsonError);
    }
  });

  it('refuses values that are not JSON, naming where they are', () => {
    const cyc: Record<string, unknown> = { a: 1 };
    cyc.self = { back: cyc };
    const cases: [unknown, RegExp][] = [
      [{ f() {} }, /function at \$\.f/],
      [{ s: Symbol('x') }, /symbol at \$\.s/],
      [cyc, /circular reference at \$\.self\.back/],
      [new Map<unknown, unknown>([[1, 2]]), /key is number/],
      [{ a: [1, undefined] }, /undefined in an array at \$\.a\[1\]/],
      [{ a: new Set([1]) }, /Set at \$\.a/],
      [{ 'odd key': new (class Foo {})() }, /Foo at \$\["odd key"\]/],
      [undefined, /undefined/],
    ];
    for (const [value, message] of cases) {
      expect(() => stringifyLossless(value)).toThrow(LosslessJsonError);
      expect(() => stringifyLossless(value)).toThrow(message);
      expect(() => encodeLines([value])).toThrow(message);
    }
    // Like JSON.stringify: undefined properties are skipped, toJSON is used.
    expect(stringifyLossless({ a: undefined, d: new Date(0) })).toBe('{"d":"1970-01-01T00:00:00.000Z"}');
  });

  it('agrees with the slow parser on every input (fast-path soundness)', () => {
    const rnd = seeded(7);
    const pick = <T>(a: T[]) => a[Math.floor(rnd() * a.length)]!;
    const nums = [
      '0',
      '-0',
      '1',
      '1.0',
      '1.5',
      '1e+16',
      '1E5',
      '1e-7',
      '0.000001',
      '0.0000012',
      '123456789012345',
      '1234567890123456',
      '9007199254740991',
      '9007199254740992',
      '-9007199254740993',
      '1180591620717411303424',
      '0.1',
      '0.30000000000000004',
      '0.10000000000000001',
      '1.50',
      '2.5e-3',
      'NaN',
      'Infinity',
      '-Infinity',
      '1e21',
    ];
    const strs = ['"a"', '"\\""', '"\\\\"', '"x\\\\\\"y"', '"é"', '"\\u00e9"', '"\\ud800"', '"12"', '"NaN 1.0"', '""'];
    const keys = ['"a"', '"b"', '"0"', '"1"', '"10"', '"2"', '"01"', '"4294967295"', '"__proto__"', '"x\\"y"'];
    const gen = (d: number): string => {
      const r = rnd();
      const ws = () => (rnd() < 0.2 ? ' ' : '');
      if (d > 4 || r < 0.35) return pick(nums);
      if (r < 0.5) return pick(strs);
      if (r < 0.55) return pick(['true', 'false', 'null']);
      const n = Math.floor(rnd() * 4);
      if (r < 0.75) return `[${Array.from({ length: n }, () => ws() + gen(d + 1) + ws()).join(',')}]`;
      return `{${Array.from({ length: n }, () => `${ws()}${pick(keys)}${ws()}:${ws()}${gen(d + 1)}`).join(',')}}`;
    };
    for (let k = 0; k < 20000; k++) {
      const text = gen(0);
      const fast = parseLossless(text);
      expect(tag(fast), text).toBe(tag(parseLosslessSlow(text)));
      const out = stringifyLossless(fast);
      expect(stringifyLossless(parseLossless(out)), text).toBe(out);
    }
  });
});

describe('JsonLineEncoder', () => {
  it('runs the WebAssembly kernels here (the bootstrap builds protocol/json-kernels.wasm)', () => {
    expect(jsonKernelsAvailable()).toBe(true);
  });

  it('writes exactly stringifyLossless + LF, across batch boundaries', () => {
    const rnd = seeded(11);
    const pick = <T>(a: T[]) => a[Math.floor(rnd() * a.length)]!;
    const chars = ['a', ' ', '"', '\\', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', 'ÿ', '東', '😀', '\ud800', '\udc00', '\u2028'];
    const str = () => {
      const n = rnd() < 0.05 ? Math.floor(rnd() * 5000) : Math.floor(rnd() * 40);
      let s = '';
      for (let i = 0; i < n; i++) s += rnd() < 0.7 ? 'xyzw'[Math.floor(rnd() * 4)] : pick(chars);
      return s;
    };
    const val = (d: number): unknown => {
      const r = rnd();
      if (d > 4 || r < 0.3) {
        return pick<unknown>([0, -0, 1.5, NaN, Infinity, -Infinity, 2n ** 70n, new LosslessNumber('1.0'), true, null, 1e21, 5e-324]);
      }
      if (r < 0.55) return str();
      if (r < 0.7) return Array.from({ length: Math.floor(rnd() * 5) }, () => val(d + 1));
      if (r < 0.75)
        return new OrderedObject([
          ['b', val(d + 1) as LosslessValue],
          ['2', val(d + 1) as LosslessValue],
        ]);
      const o: Record<string, unknown> = {};
      for (let i = 0; i < Math.floor(rnd() * 5); i++) o[pick(['a', '0', '10', 'key "q"', 'é', str()])] = rnd() < 0.1 ? undefined : val(d + 1);
      return o;
    };
    const values = Array.from({ length: 3000 }, () => val(0));
    const expected = Buffer.from(values.map((v) => `${stringifyLossless(v)}\n`).join(''));
    for (const batch of [64 << 10, 1 << 20]) expect(encodeLines(values, batch).equals(expected)).toBe(true);
  });

  it('escapes every UTF-16 unit exactly like JSON.stringify (controls, surrogates)', () => {
    const rnd = seeded(99);
    const units = [
      0x00, 0x08, 0x09, 0x0a, 0x0c, 0x0d, 0x1f, 0x20, 0x22, 0x5c, 0x7f, 0x80, 0xff, 0x100, 0x7ff, 0x800, 0x7fff, 0x8000, 0xd7ff, 0xd800, 0xdbff, 0xdc00, 0xdfff,
      0xe000, 0xfffd, 0xffff, 0x4e2d,
    ];
    const strings: string[] = [];
    for (let k = 0; k < 20000; k++) {
      const n = Math.floor(rnd() * 80);
      const dense = rnd();
      const a: number[] = [];
      for (let i = 0; i < n; i++) a.push(rnd() < dense ? units[Math.floor(rnd() * units.length)]! : 0x61 + Math.floor(rnd() * 26));
      strings.push(String.fromCharCode(...a));
    }
    const expected = Buffer.from(strings.map((s) => `${JSON.stringify(s)}\n`).join(''));
    expect(encodeLines(strings, 1 << 16).equals(expected)).toBe(true);
  });

  it('writes a JsonText as its text: the bytes a parsed copy of that text would give', () => {
    const boundaries: unknown[] = [
      { next: 'invoke_agent', handles: { agent_cookies: { session: 'eyJ.x' }, resources_verify: 'replay' } },
      { nested: [1, 1.5, -2, 1e21, 5e-324, true, null, 'é東😀\u2028"\\\n'], empty: {}, list: [] },
      ['a', { b: 'x'.repeat(100_000) }],
    ];
    const copies = boundaries.map((b) => ({ episode_id: { rollout_id: 'r', attempt: 0 }, boundary: JSON.parse(JSON.stringify(b)) }));
    const texts = boundaries.map((b) => ({ episode_id: { rollout_id: 'r', attempt: 0 }, boundary: new JsonText(JSON.stringify(b)) }));
    for (const batch of [1 << 16, 1 << 20]) expect(encodeLines(texts, batch).equals(encodeLines(copies, batch))).toBe(true);
    expect(texts.map((t) => stringifyLossless(t))).toEqual(copies.map((c) => stringifyLossless(c)));
    // Plain JSON.stringify (a caller outside the records writer) sees the value.
    expect(JSON.parse(JSON.stringify(texts[0]))).toEqual(copies[0]);
  });

  it('handles strings larger than its batch', () => {
    const big = 'a"\n'.repeat(400_000);
    const out = encodeLines([{ big }, 'tail'], 1 << 16);
    expect(out.toString()).toBe(`${JSON.stringify({ big })}\n"tail"\n`);
  });
});

const parseUtf8 = (bytes: Buffer) => parseLossless(jsonTextOfUtf8(bytes));

describe('jsonTextOfUtf8', () => {
  it('parses ASCII, sparse and dense non-ASCII lines like parseLossless of the decoded text', () => {
    const lines = [
      '{"a":"plain","n":1.0}',
      `{"t":"${'word '.repeat(500)}café — ok ${'more '.repeat(500)}😀"}`,
      `{"t":"${'東京 données '.repeat(2000)}"}`,
      '{"k":"é","x":[1,"ÿ\\u00e9",NaN],"2":"b"}',
    ];
    for (const line of lines) {
      const bytes = Buffer.from(line);
      expect(tag(parseUtf8(bytes))).toBe(tag(parseLossless(line)));
      expect(stringifyLossless(parseUtf8(bytes))).toBe(stringifyLossless(parseLossless(line)));
    }
  });

  it('refuses invalid UTF-8 and non-ASCII outside strings', () => {
    expect(() => parseUtf8(Buffer.from([0x22, 0xff, 0x22]))).toThrow(/UTF-8/);
    expect(() => parseUtf8(Buffer.from('{"a":1}é'))).toThrow(LosslessJsonError);
    expect(() => parseUtf8(Buffer.from('\ufeff{"a":1}'))).toThrow(LosslessJsonError);
  });
});

describe('toPlainJson', () => {
  it('gives back a value native JSON.parse produced without copying it', () => {
    const v = JSON.parse('{"a":[1,{"b":"x"}],"c":null,"d":{"e":true}}') as Record<string, unknown>;
    expect(toPlainJson(v)).toBe(v);
    // parseLossless's native path: known plain, returned without a walk.
    const w = parseLossless('{"a":[1.5,{"b":"x"}],"c":-0.25}');
    expect(toPlainJson(w)).toBe(w);
  });

  it('turns lossless numbers, big integers and ordered objects into plain values, copying only their containers', () => {
    const v = parseLossless('{"keep":{"x":[1,2]},"n":1.0,"big":12345678901234567890,"arr":[{"m":1e400}],"__proto__":{"k":NaN}}') as Record<string, unknown>;
    const p = toPlainJson(v) as Record<string, unknown>;
    expect(p).not.toBe(v);
    expect(p.keep).toBe(v.keep); // unchanged subtree shared
    expect(p.n).toBe(1);
    expect(p.big).toBe(Number('12345678901234567890'));
    expect((p.arr as Array<Record<string, unknown>>)[0]!.m).toBe(Infinity);
    expect(Object.getPrototypeOf(p)).toBe(Object.prototype);
    expect(Object.hasOwn(p, '__proto__')).toBe(true);
    expect((Object.getOwnPropertyDescriptor(p, '__proto__')!.value as Record<string, unknown>).k).toBeNaN();
  });
});
