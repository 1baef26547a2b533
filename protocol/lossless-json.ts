// Lossless JSON for checkpoint records (control-plane.md §9.4): a record read and written
// again gives the same bytes, and every value a foreign (Python) writer can emit survives.
//
// Value model (what `parseLossless` returns, what `stringifyLossless` accepts):
// * object  → a plain object, or an `OrderedObject` (a Map) when the text's key order has an
//   array-index key ("0".."4294967294") after another key or out of ascending order: JS objects
//   always list such keys first, ascending, so only a Map can keep that order. `stringify`
//   also accepts any `Map<string, …>` as an object;
// * integer literal outside ±(2^53-1) → `bigint` (so 2**70 round-trips);
// * number text JS would print differently (`1.0`, `1e+16`, `1E5`, `0.10000000000000001`)
//   → `LosslessNumber` (the raw text; `valueOf()` gives the number); written back verbatim;
// * `NaN`, `Infinity`, `-Infinity` (Python's non-standard tokens) ↔ the JS non-finite numbers;
// * any other number → `number`; JS `-0` is written `-0` (JSON.stringify would lose the sign).
//
// Refusals: a value whose type has no JSON form (function, symbol, bigint key, class instance,
// Set, cycle…) is refused with `LosslessJsonError` and the path to it; `undefined` properties
// are skipped and `toJSON` (Date) is honoured, like JSON.stringify.
//
// Speed, since records are hundreds of MB:
// * `parseLossless`: native JSON.parse after a pre-scan that skips strings with `indexOf` and
//   looks only at number tokens and integer-like keys; the hand-written parser only for lines
//   that need it (NaN tokens, `1.0`, big integers, out-of-order index keys).
// * `stringifyLossless`: native JSON.stringify after one type walk that never reads strings.
// * `JsonLineEncoder` (storage writer): bytes straight from values, strings escaped by a SIMD
//   WebAssembly kernel — about 2-3x faster than JSON.stringify + UTF-8 encoding here.
// * `parseLosslessUtf8` (storage reader): ASCII lines decode as Latin-1; other lines are first
//   rewritten to ASCII (\uXXXX) by a kernel, which beats V8's UTF-8 decoder several times over.
// All paths give identical bytes/values; the tests hold them to that.
import { isAscii, isUtf8 } from 'node:buffer';

/** A JSON number whose text JS would not reproduce (`1.0`, `1e+16`); kept and re-emitted verbatim. */
export class LosslessNumber {
  readonly raw: string;

  constructor(raw: string) {
    if (!isNumberText(raw)) throw new LosslessJsonError(`not a JSON number: ${JSON.stringify(raw)}`);
    this.raw = raw;
  }

  valueOf(): number {
    return Number(this.raw);
  }

  toString(): string {
    return this.raw;
  }

  /** For callers that hand a record to plain `JSON.stringify`: the nearest number (lossy). */
  toJSON(): number {
    return Number(this.raw);
  }
}

/**
 * A JSON object whose key order a plain JS object cannot represent (array-index keys not in
 * ascending order at the front). Produced by the reader only when needed; written as an object.
 */
export class OrderedObject extends Map<string, LosslessValue> {
  /** The same entries as a plain object (JS key order; for reading fields, not for writing back). */
  toPlain(): Record<string, LosslessValue> {
    const out: Record<string, LosslessValue> = {};
    for (const [k, v] of this) defineKey(out, k, v);
    return out;
  }
}

/**
 * Trees `parseLossless` got from native JSON.parse: they hold no lossless value, so `toPlainJson`
 * returns them without a walk (a restore of 7,600 agent records walked them in ~0.04 CPU-s).
 * Nothing puts lossless values into a parsed tree afterwards.
 */
const nativelyParsed = new WeakSet<object>();

/**
 * Lossless values (as read from a records file) → plain JSON values: big integers and
 * LosslessNumbers become numbers, OrderedObjects plain objects. Copies only the containers on the
 * way to a value that changes, so a value native JSON.parse produced comes back as is.
 */
export function toPlainJson(v: unknown): unknown {
  if (v === null || typeof v !== 'object') return typeof v === 'bigint' ? Number(v) : v;
  if (nativelyParsed.has(v)) return v;
  if (v instanceof LosslessNumber) return v.valueOf();
  if (v instanceof OrderedObject) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of v) defineKey(out, k, toPlainJson(x));
    return out;
  }
  if (Array.isArray(v)) {
    let out: unknown[] | undefined;
    for (let i = 0; i < v.length; i++) {
      const x = v[i] as unknown;
      const p = toPlainJson(x);
      if (p !== x) (out ??= v.slice())[i] = p;
    }
    return out ?? v;
  }
  const o = v as Record<string, unknown>;
  let out: Record<string, unknown> | undefined;
  for (const k of Object.keys(o)) {
    const x = o[k];
    const p = toPlainJson(x);
    if (p === x) continue;
    // Spread and defineKey create own data properties (a `__proto__` key stays a key).
    out ??= { ...o };
    defineKey(out, k, p);
  }
  return out ?? o;
}

export type LosslessValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | LosslessNumber
  | OrderedObject
  | LosslessValue[]
  | { [key: string]: LosslessValue };

/** Thrown by `stringifyLossless` for a value that is not JSON, and by `parseLossless` for bad text. */
export class LosslessJsonError extends Error {
  /** What is wrong, without the location. */
  readonly reason: string;
  /** Where in the value the problem is (`$.state.messages[3]`); `$` for the whole value or text. */
  readonly path: string;

  constructor(reason: string, path = '$') {
    super(path === '$' ? reason : `${reason} at ${path}`);
    this.name = 'LosslessJsonError';
    this.reason = reason;
    this.path = path;
  }
}

// --- numbers ------------------------------------------------------------------------------

const NUMBER_TEXT = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;
const INTEGER_TEXT = /^-?(?:0|[1-9]\d*)$/;
const NUMBER_STICKY = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
const ARRAY_INDEX = /^(?:0|[1-9]\d{0,9})$/;
const MAX_ARRAY_INDEX = 4294967294;

function isNumberText(s: string): boolean {
  return NUMBER_TEXT.test(s);
}

/** How the writer prints a JS number. */
function renderNumber(n: number): string {
  if (n !== n) return 'NaN';
  if (n === Infinity) return 'Infinity';
  if (n === -Infinity) return '-Infinity';
  if (n === 0 && 1 / n < 0) return '-0';
  return String(n);
}

/** The value the reader gives a valid JSON number token (see the value model above). */
function numberFromText(text: string): number | bigint | LosslessNumber {
  const n = Number(text);
  if (INTEGER_TEXT.test(text)) return Number.isSafeInteger(n) ? n : BigInt(text);
  return renderNumber(n) === text ? n : new LosslessNumber(text);
}

function isArrayIndex(key: string): boolean {
  return ARRAY_INDEX.test(key) && Number(key) <= MAX_ARRAY_INDEX;
}

function defineKey(obj: Record<string, unknown>, key: string, value: unknown): void {
  // `obj['__proto__'] = v` would set the prototype instead of creating the key.
  if (key === '__proto__') {
    Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });
  } else {
    obj[key] = value;
  }
}

// --- writer -------------------------------------------------------------------------------

/** Deeper than this the fast check gives up (so a cycle ends it) and the slow path decides. */
const FAST_DEPTH = 200;

/**
 * True when native `JSON.stringify` would not give exactly our output: anything other than
 * plain objects, arrays, strings, booleans, null and finite non-negative-zero numbers; an
 * `undefined` array slot (native writes null); or nesting deeper than FAST_DEPTH.
 * Property values that are `undefined` are skipped by both writers, like JSON.stringify.
 */
function needsSlowPath(v: unknown, depth: number): boolean {
  switch (typeof v) {
    case 'string':
    case 'boolean':
      return false;
    case 'number':
      return v - v !== 0 || (v === 0 && 1 / v < 0);
    case 'object': {
      if (v === null) return false;
      if (depth > FAST_DEPTH) return true;
      if (Array.isArray(v)) {
        for (let i = 0; i < v.length; i++) {
          const x: unknown = v[i];
          if (x === undefined || needsSlowPath(x, depth + 1)) return true;
        }
        return false;
      }
      const proto: unknown = Object.getPrototypeOf(v);
      if (proto !== Object.prototype && proto !== null) return true;
      const o = v as Record<string, unknown>;
      for (const k in o) {
        const x = o[k];
        if (x !== undefined && needsSlowPath(x, depth + 1)) return true;
      }
      return false;
    }
    default:
      return true; // bigint, function, symbol, undefined
  }
}

function describe(v: unknown): string {
  if (typeof v === 'function') return 'a function';
  if (typeof v === 'symbol') return 'a symbol';
  if (v === undefined) return 'undefined';
  const ctor = (v as { constructor?: { name?: unknown } }).constructor;
  return typeof ctor?.name === 'string' && ctor.name ? `a ${ctor.name}` : 'a non-plain object';
}

function withPath(err: unknown, segment: string): unknown {
  if (err instanceof LosslessJsonError) return new LosslessJsonError(err.reason, `$${segment}${err.path.slice(1)}`);
  if (err instanceof RangeError) return new LosslessJsonError(`value nested too deeply (${err.message})`, `$${segment}`);
  return err;
}

function keySegment(k: string): string {
  return /^[A-Za-z_$][\w$]*$/.test(k) ? `.${k}` : `[${JSON.stringify(k)}]`;
}

/** The slow writer: handles every supported value; clean subtrees still go to native. */
function writeSlow(v: unknown, ancestors: object[]): string {
  switch (typeof v) {
    case 'string':
      return JSON.stringify(v);
    case 'boolean':
      return v ? 'true' : 'false';
    case 'number':
      return renderNumber(v);
    case 'bigint':
      return v.toString();
    case 'object':
      break;
    default:
      throw new LosslessJsonError(`cannot serialize ${describe(v)}`);
  }
  if (v === null) return 'null';
  if (v instanceof LosslessNumber) return v.raw;
  if (ancestors.includes(v)) throw new LosslessJsonError('circular reference');
  ancestors.push(v);
  try {
    if (Array.isArray(v)) {
      let out = '[';
      for (let i = 0; i < v.length; i++) {
        const x: unknown = v[i];
        if (i > 0) out += ',';
        try {
          if (x === undefined) throw new LosslessJsonError('cannot serialize undefined in an array');
          out += writeChild(x, ancestors);
        } catch (err) {
          throw withPath(err, `[${i}]`);
        }
      }
      return `${out}]`;
    }
    if (v instanceof Map) {
      let out = '{';
      let first = true;
      for (const [k, x] of v) {
        if (typeof k !== 'string') throw new LosslessJsonError(`object key is ${typeof k}, not a string`);
        if (x === undefined) continue;
        try {
          out += `${first ? '' : ','}${JSON.stringify(k)}:${writeChild(x, ancestors)}`;
        } catch (err) {
          throw withPath(err, keySegment(k));
        }
        first = false;
      }
      return `${out}}`;
    }
    const proto: unknown = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) {
      const toJSON = (v as { toJSON?: unknown }).toJSON;
      if (typeof toJSON === 'function') return writeChild(toJSON.call(v, ''), ancestors);
      throw new LosslessJsonError(`cannot serialize ${describe(v)}`);
    }
    const o = v as Record<string, unknown>;
    let out = '{';
    let first = true;
    for (const k of Object.keys(o)) {
      const x = o[k];
      if (x === undefined) continue;
      try {
        out += `${first ? '' : ','}${JSON.stringify(k)}:${writeChild(x, ancestors)}`;
      } catch (err) {
        throw withPath(err, keySegment(k));
      }
      first = false;
    }
    return `${out}}`;
  } finally {
    ancestors.pop();
  }
}

function writeChild(x: unknown, ancestors: object[]): string {
  if (typeof x === 'object' && x !== null && !needsSlowPath(x, ancestors.length)) return JSON.stringify(x);
  return writeSlow(x, ancestors);
}

/**
 * Compact JSON text of `value`, lossless per the value model above. Throws `LosslessJsonError`
 * (with the path of the offending value) for functions, symbols, `undefined` outside an object
 * property, circular references, non-string Map keys and non-plain objects (class instances,
 * Set, typed arrays…; objects with a `toJSON` method such as Date are written as its result).
 */
export function stringifyLossless(value: unknown): string {
  if (!needsSlowPath(value, 0)) return JSON.stringify(value);
  try {
    return writeSlow(value, []);
  } catch (err) {
    if (err instanceof RangeError) throw new LosslessJsonError(`value nested too deeply (${err.message})`);
    throw err;
  }
}

// --- reader -------------------------------------------------------------------------------

/**
 * True when native `JSON.parse(text)` gives exactly what the slow parser gives (or throws for
 * the same invalid text): no NaN/Infinity tokens, no array-index keys, and every number token
 * a safe integer or printed back identically by `renderNumber`. Strings are skipped unread.
 */
export function nativeIsLossless(s: string): boolean {
  const n = s.length;
  let i = 0;
  while (i < n) {
    const c = s.charCodeAt(i);
    if (c === 34) {
      // A string: its end is the next quote preceded by an even number of backslashes.
      let q = s.indexOf('"', i + 1);
      while (q > 0 && s.charCodeAt(q - 1) === 92) {
        let k = q - 2;
        while (s.charCodeAt(k) === 92) k--;
        if ((q - 1 - k) % 2 === 0) break; // an even number of backslashes: the quote is real
        q = s.indexOf('"', q + 1);
      }
      if (q < 0) return true; // unterminated: native throws
      const f = s.charCodeAt(i + 1);
      if (f >= 48 && f <= 57) {
        let j = q + 1;
        let w = s.charCodeAt(j);
        while (w === 32 || w === 9 || w === 10 || w === 13) w = s.charCodeAt(++j);
        if (w === 58 && isArrayIndex(s.slice(i + 1, q))) return false;
      }
      i = q + 1;
      continue;
    }
    if (c === 45 || (c >= 48 && c <= 57)) {
      const start = i;
      let digits = 0;
      let frac = false;
      let exp = false;
      if (c === 45) i++;
      while (i < n) {
        const d = s.charCodeAt(i);
        if (d >= 48 && d <= 57) digits++;
        else if (d === 46) frac = true;
        else if (d === 101 || d === 69 || d === 43 || d === 45) exp = true;
        else break;
        i++;
      }
      if (digits === 0) return false; // `-Infinity` (or invalid text: the slow parser reports it)
      // ≤ 15 significant digits without exponent or trailing fraction zero always print back
      // identically (DBL_DIG = 15), except below 1e-6 where JS switches to exponent notation.
      if (
        exp ||
        digits > 15 ||
        (frac && (s.charCodeAt(i - 1) === 48 || s.startsWith('0.000000', c === 45 ? start + 1 : start)))
      ) {
        const text = s.slice(start, i);
        if (!isNumberText(text) || typeof numberFromText(text) !== 'number') return false;
      }
      continue;
    }
    if (c === 78 || c === 73) return false; // NaN, Infinity
    i++;
  }
  return true;
}

interface Cursor {
  s: string;
  i: number;
}

function fail(cur: Cursor, what: string): never {
  const at = cur.i < cur.s.length ? `${JSON.stringify(cur.s[cur.i])} ` : '';
  throw new LosslessJsonError(`invalid JSON: ${what}, found ${at || 'end of text '}at position ${cur.i}`, '$');
}

function skipWs(cur: Cursor): number {
  const s = cur.s;
  let i = cur.i;
  let c = s.charCodeAt(i);
  while (c === 32 || c === 10 || c === 13 || c === 9) c = s.charCodeAt(++i);
  cur.i = i;
  return c;
}

function expectWord(cur: Cursor, word: string): void {
  if (!cur.s.startsWith(word, cur.i)) fail(cur, `expected ${word}`);
  cur.i += word.length;
}

function parseString(cur: Cursor): string {
  const s = cur.s;
  const start = cur.i; // at the opening quote
  let q = s.indexOf('"', start + 1);
  let escaped = false;
  while (q > 0 && s.charCodeAt(q - 1) === 92) {
    let k = q - 2;
    while (s.charCodeAt(k) === 92) k--;
    if ((q - 1 - k) % 2 === 0) break;
    escaped = true;
    q = s.indexOf('"', q + 1);
  }
  if (q < 0) fail(cur, 'unterminated string');
  cur.i = q + 1;
  if (!escaped && q - start <= 64) {
    const b = s.indexOf('\\', start + 1);
    if (b < 0 || b > q) {
      for (let k = start + 1; k < q; k++) {
        if (s.charCodeAt(k) < 32) {
          cur.i = k;
          fail(cur, 'control character in string');
        }
      }
      return s.slice(start + 1, q);
    }
  }
  // Escapes (and long strings, to get a flat copy validated natively) go through JSON.parse.
  try {
    return JSON.parse(s.slice(start, q + 1)) as string;
  } catch (err) {
    cur.i = start;
    return fail(cur, `bad string (${(err as Error).message})`);
  }
}

function parseNumber(cur: Cursor): number | bigint | LosslessNumber {
  NUMBER_STICKY.lastIndex = cur.i;
  if (!NUMBER_STICKY.test(cur.s)) fail(cur, 'expected a value');
  const text = cur.s.slice(cur.i, NUMBER_STICKY.lastIndex);
  cur.i = NUMBER_STICKY.lastIndex;
  return numberFromText(text);
}

function parseValue(cur: Cursor): LosslessValue {
  const c = skipWs(cur);
  switch (c) {
    case 123: // {
      return parseObject(cur);
    case 91: {
      // [
      cur.i++;
      const out: LosslessValue[] = [];
      if (skipWs(cur) === 93) {
        cur.i++;
        return out;
      }
      for (;;) {
        out.push(parseValue(cur));
        const d = skipWs(cur);
        cur.i++;
        if (d === 44) continue;
        if (d === 93) return out;
        cur.i--;
        fail(cur, "expected ',' or ']'");
      }
    }
    case 34:
      return parseString(cur);
    case 116:
      expectWord(cur, 'true');
      return true;
    case 102:
      expectWord(cur, 'false');
      return false;
    case 110:
      expectWord(cur, 'null');
      return null;
    case 78:
      expectWord(cur, 'NaN');
      return NaN;
    case 73:
      expectWord(cur, 'Infinity');
      return Infinity;
    case 45:
      if (cur.s.charCodeAt(cur.i + 1) === 73) {
        expectWord(cur, '-Infinity');
        return -Infinity;
      }
      return parseNumber(cur);
    default:
      if (c >= 48 && c <= 57) return parseNumber(cur);
      return fail(cur, 'expected a value');
  }
}

function parseObject(cur: Cursor): LosslessValue {
  cur.i++;
  const obj: Record<string, LosslessValue> = {};
  if (skipWs(cur) === 125) {
    cur.i++;
    return obj;
  }
  const keys: string[] = [];
  const values: LosslessValue[] = [];
  let indexKey = false;
  for (;;) {
    if (skipWs(cur) !== 34) fail(cur, 'expected a string key');
    const key = parseString(cur);
    if (skipWs(cur) !== 58) fail(cur, "expected ':'");
    cur.i++;
    const value = parseValue(cur);
    defineKey(obj, key, value);
    keys.push(key);
    values.push(value);
    if (!indexKey && isArrayIndex(key)) indexKey = true;
    const d = skipWs(cur);
    cur.i++;
    if (d === 44) continue;
    if (d === 125) break;
    cur.i--;
    fail(cur, "expected ',' or '}'");
  }
  if (!indexKey) return obj;
  // JS lists array-index keys first; keep the plain object only if that is the text's order
  // (first occurrences; a repeated key keeps its first position and its last value, as natively).
  const own = Object.keys(obj);
  const seen = new Set<string>();
  let k = 0;
  let same = true;
  for (const key of keys) {
    if (seen.has(key)) continue;
    seen.add(key);
    if (own[k++] !== key) {
      same = false;
      break;
    }
  }
  if (same) return obj;
  const ordered = new OrderedObject();
  for (let j = 0; j < keys.length; j++) ordered.set(keys[j]!, values[j]!);
  return ordered;
}

function parseSlow(text: string): LosslessValue {
  const cur: Cursor = { s: text, i: 0 };
  let value: LosslessValue;
  try {
    value = parseValue(cur);
  } catch (err) {
    if (err instanceof RangeError) throw new LosslessJsonError('invalid JSON: nested too deeply');
    throw err;
  }
  skipWs(cur);
  if (cur.i < cur.s.length) fail(cur, 'unexpected text after the value');
  return value;
}

/**
 * Parses JSON text (plus the tokens NaN, Infinity, -Infinity) into the value model above.
 * Throws `LosslessJsonError` for invalid text.
 */
export function parseLossless(text: string): LosslessValue {
  if (nativeIsLossless(text)) {
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch (err) {
      throw new LosslessJsonError(`invalid JSON: ${(err as Error).message}`);
    }
    if (typeof v === 'object' && v !== null) nativelyParsed.add(v);
    return v as LosslessValue;
  }
  return parseSlow(text);
}

/** Test hook: the slow parser alone (the fast path must agree with it on every input). */
export function parseLosslessSlow(text: string): LosslessValue {
  return parseSlow(text);
}

// --- WebAssembly kernels ----------------------------------------------------------------
//
// Two loops V8 has no fast native for: on this class of machine JSON.stringify escapes strings
// at ~300 MB/s and both UTF-8 directions for text with any non-ASCII run at ~250-300 MB/s,
// which alone would put a 350 MB commit or restore over a second.
// * `escape(src, units, dst) → dstEnd`: a string's UTF-16 code units → the UTF-8 body of its
//   JSON string literal, byte-identical to JSON.stringify (\" \\ \b \f \n \r \t, other
//   controls \u00xx, lone surrogates \udxxx); 16 units per step while they are plain ASCII.
// * `asciify(src, len, dst, limit) → dstEnd | -1`: valid UTF-8 JSON text → the same JSON with
//   every non-ASCII character written \uXXXX (non-ASCII can only occur inside strings), so it
//   decodes as Latin-1 at memcpy speed and JSON.parse gives the same value. -1 when the output
//   would pass `limit` (dense non-ASCII: the native decoder is then the better choice).
// The module is emitted at load time from the instruction lists below (no toolchain, no blob).

const TABLE_OFF = 0; // escape letter per byte value (0 = use \u00xx)
const HEX_OFF = 128; // "0123456789abcdef"
const RESERVED = 1024;
const PAGE = 65536;

function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return out;
}

function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && !(b & 0x40)) || (n === -1 && b & 0x40)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
}

function wasmVec(items: number[][]): number[] {
  return [...uleb(items.length), ...items.flat()];
}

function wasmSection(id: number, bytes: number[]): number[] {
  return [id, ...uleb(bytes.length), ...bytes];
}

function wasmName(s: string): number[] {
  return [...uleb(s.length), ...Buffer.from(s, 'latin1')];
}

/** The few WebAssembly opcodes used (core spec; SIMD ones are 0xfd-prefixed). */
const W = {
  get: (i: number) => [0x20, ...uleb(i)],
  set: (i: number) => [0x21, ...uleb(i)],
  tee: (i: number) => [0x22, ...uleb(i)],
  i32: (n: number) => [0x41, ...sleb(n)],
  load8: (off = 0) => [0x2d, 0, ...uleb(off)],
  load16: (off = 0) => [0x2f, 0, ...uleb(off)],
  store8: (off = 0) => [0x3a, 0, ...uleb(off)],
  add: [0x6a],
  sub: [0x6b],
  eq: [0x46],
  ne: [0x47],
  geU: [0x4f],
  ltU: [0x49],
  gtU: [0x4b],
  leU: [0x4d],
  eqz: [0x45],
  and: [0x71],
  or: [0x72],
  shl: [0x74],
  shrU: [0x76],
  ctz: [0x68],
  block: [0x02, 0x40],
  loop: [0x03, 0x40],
  if: [0x04, 0x40],
  else: [0x05],
  end: [0x0b],
  br: (depth: number) => [0x0c, ...uleb(depth)],
  brIf: (depth: number) => [0x0d, ...uleb(depth)],
  return: [0x0f],
  v128Load: [0xfd, ...uleb(0x00), 0, 0],
  v128LoadAt: (off: number) => [0xfd, ...uleb(0x00), 0, ...uleb(off)],
  i8x16NarrowU: [0xfd, ...uleb(0x66)],
  v128Store: [0xfd, ...uleb(0x0b), 0, 0],
  i8x16Splat: [0xfd, ...uleb(0x0f)],
  i8x16Eq: [0xfd, ...uleb(0x23)],
  i8x16LtU: [0xfd, ...uleb(0x26)],
  v128Or: [0xfd, ...uleb(0x50)],
  i8x16Bitmask: [0xfd, ...uleb(0x64)],
};

const I32 = 0x7f;
const V128 = 0x7b;

/**
 * escape16(src, units, dst): the UTF-16 code units of a string (as `Buffer#write(s, 'utf16le')`
 * lays them out) → the UTF-8 body of its JSON string literal, exactly as JSON.stringify writes
 * it (lone surrogates as \udxxx). Params src0 units1 dst2; locals end3 m4 u5 e6 lo7 (i32), v8 (v128).
 */
function escape16Body(): number[] {
  const [src, units, dst, end, m, u, e, lo, v] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const { get, set, tee, i32 } = W;
  const inc = (local: number, n: number) => [...get(local), ...i32(n), ...W.add, ...set(local)];
  const put = (off: number, value: number[]) => [...get(dst), ...value, ...W.store8(off)];
  // An ASCII unit `u` that needs an escape: \" \\ \b \f \n \r \t, else \u00xx.
  const emitEscape = [
    ...put(0, i32(0x5c)),
    ...get(u), ...W.load8(TABLE_OFF), ...tee(e),
    ...W.if,
      ...put(1, get(e)),
      ...inc(dst, 2),
    ...W.else,
      ...put(1, i32(0x75)),
      ...put(2, i32(0x30)),
      ...put(3, i32(0x30)),
      ...put(4, [...get(u), ...i32(4), ...W.shrU, ...W.load8(HEX_OFF)]),
      ...put(5, [...get(u), ...i32(15), ...W.and, ...W.load8(HEX_OFF)]),
      ...inc(dst, 6),
    ...W.end,
  ];
  const hex = (shift: number) => [...get(u), ...i32(shift), ...W.shrU, ...i32(15), ...W.and, ...W.load8(HEX_OFF)];
  const cont = (shift: number) => [...get(e), ...i32(shift), ...W.shrU, ...i32(0x3f), ...W.and, ...i32(0x80), ...W.or];
  // Any unit that is not plain ASCII (src already past it; a pair consumes its low half too).
  const emitUnit = [
    ...get(u), ...i32(0x80), ...W.ltU,
    ...W.if,
      ...emitEscape,
    ...W.else,
      ...get(u), ...i32(0x800), ...W.ltU,
      ...W.if,
        ...put(0, [...get(u), ...i32(6), ...W.shrU, ...i32(0xc0), ...W.or]),
        ...put(1, [...get(u), ...i32(0x3f), ...W.and, ...i32(0x80), ...W.or]),
        ...inc(dst, 2),
      ...W.else,
        ...get(u), ...i32(0xf800), ...W.and, ...i32(0xd800), ...W.eq,
        ...W.if,
          // A high surrogate followed by a low one is a pair; anything else is lone.
          ...get(u), ...i32(0xdc00), ...W.ltU,
          ...get(src), ...get(end), ...W.ltU, ...W.and,
          ...W.if,
            ...get(src), ...W.load16(), ...tee(lo), ...i32(0xfc00), ...W.and, ...i32(0xdc00), ...W.eq, ...set(e),
          ...W.else,
            ...i32(0), ...set(e),
          ...W.end,
          ...get(e),
          ...W.if,
            ...get(u), ...i32(0xd800), ...W.sub, ...i32(10), ...W.shl,
            ...get(lo), ...i32(0xdc00), ...W.sub, ...W.or, ...i32(0x10000), ...W.add, ...set(e),
            ...put(0, [...get(e), ...i32(18), ...W.shrU, ...i32(0xf0), ...W.or]),
            ...put(1, cont(12)),
            ...put(2, cont(6)),
            ...put(3, cont(0)),
            ...inc(dst, 4),
            ...inc(src, 2),
          ...W.else,
            ...put(0, i32(0x5c)),
            ...put(1, i32(0x75)),
            ...put(2, hex(12)),
            ...put(3, hex(8)),
            ...put(4, hex(4)),
            ...put(5, hex(0)),
            ...inc(dst, 6),
          ...W.end,
        ...W.else,
          ...get(u), ...set(e),
          ...put(0, [...get(u), ...i32(12), ...W.shrU, ...i32(0xe0), ...W.or]),
          ...put(1, cont(6)),
          ...put(2, cont(0)),
          ...inc(dst, 3),
        ...W.end,
      ...W.end,
    ...W.end,
  ];
  const body = [
    ...get(src), ...get(units), ...i32(1), ...W.shl, ...W.add, ...set(end),
    ...W.block,
    ...W.loop,
      ...get(src), ...i32(32), ...W.add, ...get(end), ...W.leU,
      ...W.if,
        // 16 units → 16 bytes (saturating narrow), stored optimistically; flag every unit that
        // is not ASCII (high bit, or 0 from a unit ≥ 0x8000) or needs an escape.
        ...get(src), ...W.v128Load, ...get(src), ...W.v128LoadAt(16), ...W.i8x16NarrowU, ...tee(v),
        ...get(dst), ...get(v), ...W.v128Store,
        ...W.i8x16Bitmask,
        ...get(v), ...i32(0x20), ...W.i8x16Splat, ...W.i8x16LtU,
        ...get(v), ...i32(0x22), ...W.i8x16Splat, ...W.i8x16Eq, ...W.v128Or,
        ...get(v), ...i32(0x5c), ...W.i8x16Splat, ...W.i8x16Eq, ...W.v128Or,
        ...W.i8x16Bitmask, ...W.or, ...tee(m), ...W.eqz,
        ...W.if,
          ...inc(src, 32),
          ...inc(dst, 16),
        ...W.else,
          ...get(m), ...W.ctz, ...tee(e), ...get(dst), ...W.add, ...set(dst),
          ...get(e), ...i32(1), ...W.shl, ...get(src), ...W.add, ...tee(src), ...W.load16(), ...set(u),
          ...inc(src, 2),
          ...emitUnit,
        ...W.end,
        ...W.br(1),
      ...W.end,
      // Fewer than 16 units left: one at a time.
      ...get(src), ...get(end), ...W.ltU, ...W.eqz, ...W.brIf(1),
      ...get(src), ...W.load16(), ...set(u),
      ...inc(src, 2),
      ...get(u), ...i32(0x20), ...W.geU,
      ...get(u), ...i32(0x80), ...W.ltU, ...W.and,
      ...get(u), ...i32(0x22), ...W.ne, ...W.and,
      ...get(u), ...i32(0x5c), ...W.ne, ...W.and,
      ...W.if,
        ...put(0, get(u)),
        ...inc(dst, 1),
      ...W.else,
        ...emitUnit,
      ...W.end,
      ...W.br(0),
    ...W.end,
    ...W.end,
    ...get(dst),
    ...W.end,
  ];
  return [...wasmVec([[...uleb(5), I32], [...uleb(1), V128]]), ...body];
}

/** asciify(src, len, dst, limit): params src0 len1 dst2 limit3; locals end4 m5 b6 cp7 x8 (i32), v9 (v128). */
function asciifyBody(): number[] {
  const [src, len, dst, limit, end, m, b, cp, x, v] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
  const { get, set, tee, i32 } = W;
  const nibble = (shift: number) => [...get(x), ...i32(shift), ...W.shrU, ...i32(15), ...W.and, ...W.load8(HEX_OFF)];
  const emitU = [
    ...get(dst), ...i32(0x5c), ...W.store8(0),
    ...get(dst), ...i32(0x75), ...W.store8(1),
    ...get(dst), ...nibble(12), ...W.store8(2),
    ...get(dst), ...nibble(8), ...W.store8(3),
    ...get(dst), ...nibble(4), ...W.store8(4),
    ...get(dst), ...nibble(0), ...W.store8(5),
    ...get(dst), ...i32(6), ...W.add, ...set(dst),
  ];
  const cont = (off: number) => [...get(src), ...W.load8(off), ...i32(0x3f), ...W.and];
  // Decodes the sequence led by `b` (≥ 0x80) at src, writes its \u escape(s), advances both.
  const decodeEmit = [
    ...get(b), ...i32(0xe0), ...W.ltU,
    ...W.if,
      ...get(b), ...i32(0x1f), ...W.and, ...i32(6), ...W.shl, ...cont(1), ...W.or, ...set(cp),
      ...get(src), ...i32(2), ...W.add, ...set(src),
    ...W.else,
      ...get(b), ...i32(0xf0), ...W.ltU,
      ...W.if,
        ...get(b), ...i32(0x0f), ...W.and, ...i32(12), ...W.shl,
        ...cont(1), ...i32(6), ...W.shl, ...W.or, ...cont(2), ...W.or, ...set(cp),
        ...get(src), ...i32(3), ...W.add, ...set(src),
      ...W.else,
        ...get(b), ...i32(0x07), ...W.and, ...i32(18), ...W.shl,
        ...cont(1), ...i32(12), ...W.shl, ...W.or, ...cont(2), ...i32(6), ...W.shl, ...W.or, ...cont(3), ...W.or, ...set(cp),
        ...get(src), ...i32(4), ...W.add, ...set(src),
      ...W.end,
    ...W.end,
    ...get(cp), ...i32(0x10000), ...W.ltU,
    ...W.if,
      ...get(cp), ...set(x), ...emitU,
    ...W.else,
      ...get(cp), ...i32(0x10000), ...W.sub, ...set(cp),
      ...i32(0xd800), ...get(cp), ...i32(10), ...W.shrU, ...W.add, ...set(x), ...emitU,
      ...i32(0xdc00), ...get(cp), ...i32(0x3ff), ...W.and, ...W.add, ...set(x), ...emitU,
    ...W.end,
    ...get(dst), ...get(limit), ...W.gtU,
    ...W.if, ...i32(-1), ...W.return, ...W.end,
  ];
  const body = [
    ...get(src), ...get(len), ...W.add, ...set(end),
    ...W.block,
    ...W.loop,
      ...get(src), ...i32(16), ...W.add, ...get(end), ...W.leU,
      ...W.if,
        ...get(src), ...W.v128Load, ...set(v),
        ...get(dst), ...get(v), ...W.v128Store,
        ...get(v), ...W.i8x16Bitmask, ...tee(m), ...W.eqz,
        ...W.if,
          ...get(src), ...i32(16), ...W.add, ...set(src),
          ...get(dst), ...i32(16), ...W.add, ...set(dst),
        ...W.else,
          ...get(m), ...W.ctz, ...tee(x), ...get(src), ...W.add, ...set(src),
          ...get(dst), ...get(x), ...W.add, ...set(dst),
          ...get(src), ...W.load8(), ...set(b),
          ...decodeEmit,
        ...W.end,
        ...W.br(1),
      ...W.end,
      ...get(src), ...get(end), ...W.ltU, ...W.eqz, ...W.brIf(1),
      ...get(src), ...W.load8(), ...tee(b), ...i32(0x80), ...W.ltU,
      ...W.if,
        ...get(dst), ...get(b), ...W.store8(),
        ...get(dst), ...i32(1), ...W.add, ...set(dst),
        ...get(src), ...i32(1), ...W.add, ...set(src),
      ...W.else,
        ...decodeEmit,
      ...W.end,
      ...W.br(0),
    ...W.end,
    ...W.end,
    ...get(dst),
    ...W.end,
  ];
  return [...wasmVec([[...uleb(5), I32], [...uleb(1), V128]]), ...body];
}

function kernelModuleBytes(): Uint8Array {
  const escape = escape16Body();
  const asciify = asciifyBody();
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    // types: 0 = (i32 i32 i32) → i32, 1 = (i32 i32 i32 i32) → i32
    ...wasmSection(1, wasmVec([
      [0x60, ...wasmVec([[I32], [I32], [I32]]), ...wasmVec([[I32]])],
      [0x60, ...wasmVec([[I32], [I32], [I32], [I32]]), ...wasmVec([[I32]])],
    ])),
    // import "k"."memory": each instance brings its own memory
    ...wasmSection(2, wasmVec([[...wasmName('k'), ...wasmName('memory'), 0x02, 0x00, ...uleb(1)]])),
    ...wasmSection(3, wasmVec([[0], [1]])),
    ...wasmSection(7, wasmVec([
      [...wasmName('escape'), 0x00, 0],
      [...wasmName('asciify'), 0x00, 1],
    ])),
    ...wasmSection(10, wasmVec([
      [...uleb(escape.length), ...escape],
      [...uleb(asciify.length), ...asciify],
    ])),
  ]);
}

// Typed locally: the project's lib (ES2023, no DOM) does not declare the WebAssembly JS API.
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: Record<string, unknown> };
  Memory: new (descriptor: { initial: number }) => WasmMemory;
}
const wasmApi = (globalThis as unknown as { WebAssembly?: WasmApi }).WebAssembly;

interface Kernels {
  memory: WasmMemory;
  escape(src: number, units: number, dst: number): number;
  asciify(src: number, len: number, dst: number, limit: number): number;
}

let kernelModule: object | null | undefined;

/** A kernel instance over a fresh memory of `bytes`; undefined where WebAssembly SIMD is unavailable. */
function instantiateKernels(bytes: number): Kernels | undefined {
  if (kernelModule === undefined) {
    try {
      kernelModule = wasmApi ? new wasmApi.Module(kernelModuleBytes()) : null;
    } catch {
      kernelModule = null; // no WebAssembly SIMD: the JS paths do everything
    }
  }
  if (!kernelModule || !wasmApi) return undefined;
  const memory = new wasmApi.Memory({ initial: Math.ceil(bytes / PAGE) });
  const inst = new wasmApi.Instance(kernelModule, { k: { memory } });
  const table = new Uint8Array(memory.buffer);
  const letters: Record<number, string> = { 0x08: 'b', 0x09: 't', 0x0a: 'n', 0x0c: 'f', 0x0d: 'r', 0x22: '"', 0x5c: '\\' };
  for (const [k, c] of Object.entries(letters)) table[TABLE_OFF + Number(k)] = c.charCodeAt(0);
  for (let i = 0; i < 16; i++) table[HEX_OFF + i] = '0123456789abcdef'.charCodeAt(i);
  const exp = inst.exports as unknown as Omit<Kernels, 'memory'>;
  return { memory, escape: exp.escape, asciify: exp.asciify };
}

/** Whether the WebAssembly kernels run here (otherwise the same bytes come from the JS paths). */
export function losslessKernelsAvailable(): boolean {
  instantiateKernels(PAGE);
  return !!kernelModule;
}

// --- line encoder (the storage writer's hot path) ----------------------------------------

/**
 * Serializes values as JSON lines (UTF-8, LF-terminated) straight into byte batches: the bytes
 * of `stringifyLossless(value) + '\n'`, produced without building the line as a JS string.
 * Batches go to `sink` as views valid only during the call (copy or consume them at once).
 * A `writeLine` that throws may already have passed part of its line to the sink.
 */
export class JsonLineEncoder {
  private readonly sink: (chunk: Buffer) => void;
  private readonly kernels: Kernels | undefined;
  private readonly mem: Buffer;
  private readonly scratchAt: number;
  private readonly maxKernelChars: number;
  private readonly outStart: number;
  private readonly outEnd: number;
  private out: number;
  /** `"key":` as UTF-8 bytes, for keys seen before (records repeat the same few keys). */
  private readonly keys = new Map<string, Uint8Array>();
  private readonly ancestors: object[] = [];

  constructor(sink: (chunk: Buffer) => void, batchBytes = 4 << 20) {
    this.sink = sink;
    const scratchBytes = batchBytes >> 1;
    this.kernels = instantiateKernels(RESERVED + scratchBytes + batchBytes + 64);
    if (this.kernels) {
      this.mem = Buffer.from(this.kernels.memory.buffer);
      this.scratchAt = RESERVED;
      this.outStart = RESERVED + scratchBytes;
    } else {
      this.mem = Buffer.allocUnsafe(batchBytes + 64);
      this.scratchAt = 0;
      this.outStart = 0;
    }
    // Escaped output is at most 6 bytes per UTF-16 unit; the units take 2 bytes each.
    this.maxKernelChars = this.kernels ? Math.floor((batchBytes - 64) / 6) : 0;
    this.outEnd = this.outStart + batchBytes;
    this.out = this.outStart;
  }

  /** Bytes buffered and not yet passed to the sink. */
  get buffered(): number {
    return this.out - this.outStart;
  }

  /** Appends `value` as one line. Throws `LosslessJsonError` for a value `stringifyLossless` refuses. */
  writeLine(value: unknown): void {
    this.ancestors.length = 0;
    try {
      this.value(value);
    } catch (err) {
      if (err instanceof RangeError) throw new LosslessJsonError(`value nested too deeply (${err.message})`);
      throw err;
    }
    this.byte(10);
  }

  /** Passes every buffered byte to the sink. */
  flush(): void {
    if (this.out > this.outStart) {
      const chunk = this.mem.subarray(this.outStart, this.out);
      this.out = this.outStart;
      this.sink(chunk);
    }
  }

  private room(n: number): void {
    if (this.out + n > this.outEnd) this.flush();
  }

  private byte(b: number): void {
    if (this.out >= this.outEnd) this.flush();
    this.mem[this.out++] = b;
  }

  // Short pieces (keys, numbers, short strings) are copied by plain JS loops: a call into
  // Buffer#write or the kernel costs more than the copy itself.

  /** An ASCII-only fragment (number text, true/false/null). */
  private ascii(s: string): void {
    const n = s.length;
    this.room(n);
    const mem = this.mem;
    let out = this.out;
    for (let i = 0; i < n; i++) mem[out++] = s.charCodeAt(i);
    this.out = out;
  }

  /** Text that is already a JSON fragment (escaped), any length. */
  private text(s: string): void {
    if (s.length * 3 <= this.outEnd - this.outStart) {
      this.room(s.length * 3);
      this.out += this.mem.write(s, this.out);
    } else {
      this.flush();
      this.sink(Buffer.from(s));
    }
  }

  private string(s: string): void {
    const n = s.length;
    if (n <= 32) {
      this.room(n + 2);
      const mem = this.mem;
      let out = this.out;
      mem[out++] = 0x22;
      let i = 0;
      for (; i < n; i++) {
        const c = s.charCodeAt(i);
        if (c < 0x20 || c >= 0x80 || c === 0x22 || c === 0x5c) break;
        mem[out++] = c;
      }
      if (i === n) {
        mem[out++] = 0x22;
        this.out = out;
        return;
      }
      // Something to escape or encode: the general path below rewrites from the start.
    }
    const k = this.kernels;
    if (!k || n > this.maxKernelChars) return this.text(JSON.stringify(s));
    this.room(6 * n + 2);
    // UTF-16 units are a copy (or a widening) of the string's own storage; the kernel does the rest.
    this.mem.write(s, this.scratchAt, 'utf16le');
    const mem = this.mem;
    mem[this.out++] = 0x22;
    this.out = k.escape(this.scratchAt, n, this.out);
    mem[this.out++] = 0x22;
  }

  private key(k: string): void {
    let bytes = this.keys.get(k);
    if (bytes === undefined) {
      const text = `${JSON.stringify(k)}:`;
      if (k.length > 64 || this.keys.size >= 4096) return this.text(text);
      bytes = Buffer.from(text);
      this.keys.set(k, bytes);
    }
    const n = bytes.length;
    this.room(n);
    const mem = this.mem;
    let out = this.out;
    for (let i = 0; i < n; i++) mem[out++] = bytes[i]!;
    this.out = out;
  }

  private value(v: unknown): void {
    switch (typeof v) {
      case 'string':
        return this.string(v);
      case 'number':
        return this.ascii(renderNumber(v));
      case 'boolean':
        return this.ascii(v ? 'true' : 'false');
      case 'bigint':
        return this.ascii(v.toString());
      case 'object':
        if (v === null) return this.ascii('null');
        return this.object(v);
      default:
        throw new LosslessJsonError(`cannot serialize ${describe(v)}`);
    }
  }

  private object(v: object): void {
    if (v instanceof LosslessNumber) return this.ascii(v.raw);
    const ancestors = this.ancestors;
    if (ancestors.includes(v)) throw new LosslessJsonError('circular reference');
    ancestors.push(v);
    try {
      if (Array.isArray(v)) {
        this.byte(0x5b);
        for (let i = 0; i < v.length; i++) {
          if (i > 0) this.byte(0x2c);
          const x: unknown = v[i];
          try {
            if (x === undefined) throw new LosslessJsonError('cannot serialize undefined in an array');
            this.value(x);
          } catch (err) {
            throw withPath(err, `[${i}]`);
          }
        }
        this.byte(0x5d);
        return;
      }
      if (v instanceof Map) {
        this.byte(0x7b);
        let first = true;
        for (const [k, x] of v) {
          if (typeof k !== 'string') throw new LosslessJsonError(`object key is ${typeof k}, not a string`);
          if (x === undefined) continue;
          if (!first) this.byte(0x2c);
          first = false;
          try {
            this.key(k);
            this.value(x);
          } catch (err) {
            throw withPath(err, keySegment(k));
          }
        }
        this.byte(0x7d);
        return;
      }
      const proto: unknown = Object.getPrototypeOf(v);
      if (proto !== Object.prototype && proto !== null) {
        const toJSON = (v as { toJSON?: unknown }).toJSON;
        if (typeof toJSON === 'function') return this.value(toJSON.call(v, ''));
        throw new LosslessJsonError(`cannot serialize ${describe(v)}`);
      }
      const o = v as Record<string, unknown>;
      this.byte(0x7b);
      let first = true;
      for (const k of Object.keys(o)) {
        const x = o[k];
        if (x === undefined) continue;
        if (!first) this.byte(0x2c);
        first = false;
        try {
          this.key(k);
          this.value(x);
        } catch (err) {
          throw withPath(err, keySegment(k));
        }
      }
      this.byte(0x7d);
    } finally {
      ancestors.pop();
    }
  }
}

// --- UTF-8 lines (the storage reader's hot path) ------------------------------------------

/** Lines longer than this skip the asciify kernel (its memory would stay that large). */
const ASCIIFY_MAX_LINE = 16 << 20;
let decodeKernels: Kernels | null | undefined;
let decodeMem: Buffer | undefined;

/** UTF-8 JSON text (a line, or LF-separated lines) as a JS string, as cheaply as its content allows. */
export function jsonTextOfUtf8(bytes: Buffer): string {
  if (isAscii(bytes)) return bytes.toString('latin1');
  if (!isUtf8(bytes)) throw new LosslessJsonError('invalid JSON: not UTF-8');
  const n = bytes.length;
  if (n <= ASCIIFY_MAX_LINE) {
    if (decodeKernels === undefined) decodeKernels = instantiateKernels(RESERVED + 3 * PAGE) ?? null;
    const k = decodeKernels;
    if (k) {
      const limit = n + (n >> 2) + 64; // past this, non-ASCII is dense: the native decoder wins
      const dst = RESERVED + n;
      const need = dst + limit + 64;
      if (need > k.memory.buffer.byteLength) k.memory.grow(Math.ceil((need - k.memory.buffer.byteLength) / PAGE));
      if (!decodeMem || decodeMem.buffer !== k.memory.buffer) decodeMem = Buffer.from(k.memory.buffer);
      bytes.copy(decodeMem, RESERVED);
      const end = k.asciify(RESERVED, n, dst, dst + limit);
      if (end >= 0) return decodeMem.toString('latin1', dst, end);
    }
  }
  return bytes.toString('utf8');
}

/** `parseLossless` of UTF-8 bytes (one records line without its LF). Refuses invalid UTF-8. */
export function parseLosslessUtf8(bytes: Uint8Array): LosslessValue {
  const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return parseLossless(jsonTextOfUtf8(buf));
}
