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
// * `JsonLineEncoder` (storage writer): bytes straight from values into large batches, keys
//   cached as bytes, short ASCII strings copied by a loop, longer strings escaped by a SIMD
//   WebAssembly kernel (json-kernels.wat), never a whole line as a JS string.
// * `jsonTextOfUtf8` (storage reader): ASCII lines decode as Latin-1, the cheapest decoding;
//   other lines are first rewritten to ASCII (\uXXXX) by a kernel.
// All paths give identical bytes/values; the tests hold them to that.
//
// Not npm `lossless-json`: it rejects the NaN/Infinity tokens Python writes, and its objects put
// index-like keys first (`{"b":1,"2":3}` comes back `{"2":3,"b":1}`), so a record would not round-trip.
import { isAscii, isUtf8 } from 'node:buffer';
import { instantiateJsonKernels, type JsonKernels, KERNEL_RESERVED_BYTES, WASM_PAGE_BYTES } from './json-kernels.js';
import { JsonText } from './json-text.js';

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
 * returns them without a walk (a restore would otherwise walk every record once more).
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

export type LosslessValue = null | boolean | number | bigint | string | LosslessNumber | OrderedObject | LosslessValue[] | { [key: string]: LosslessValue };

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
  if (Number.isNaN(n)) return 'NaN';
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
  if (v instanceof JsonText) return v.text;
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
      if (exp || digits > 15 || (frac && (s.charCodeAt(i - 1) === 48 || s.startsWith('0.000000', c === 45 ? start + 1 : start)))) {
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

// --- line encoder (the storage writer's hot path) ----------------------------------------

/**
 * Serializes values as JSON lines (UTF-8, LF-terminated) straight into byte batches: the bytes
 * of `stringifyLossless(value) + '\n'`, produced without building the line as a JS string.
 * Batches go to `sink` as views valid only during the call (copy or consume them at once).
 * A `writeLine` that throws may already have passed part of its line to the sink.
 */
export class JsonLineEncoder {
  private readonly sink: (chunk: Buffer) => void;
  private readonly kernels: JsonKernels | undefined;
  /** With the kernels, their memory: tables, then the scratch of a string's UTF-16 units, then the batch. */
  private readonly mem: Buffer;
  private readonly scratchAt: number;
  private readonly maxKernelChars: number;
  private readonly start: number;
  private readonly end: number;
  private out: number;
  /** `"key":` as UTF-8 bytes, for keys seen before (records repeat the same few keys). */
  private readonly keys = new Map<string, Uint8Array>();
  private readonly ancestors: object[] = [];

  constructor(sink: (chunk: Buffer) => void, batchBytes = 4 << 20) {
    this.sink = sink;
    const scratchBytes = batchBytes >> 1;
    this.kernels = instantiateJsonKernels(KERNEL_RESERVED_BYTES + scratchBytes + batchBytes + 64);
    this.mem = this.kernels ? Buffer.from(this.kernels.memory.buffer) : Buffer.allocUnsafe(batchBytes);
    this.scratchAt = KERNEL_RESERVED_BYTES;
    this.start = this.kernels ? KERNEL_RESERVED_BYTES + scratchBytes : 0;
    this.end = this.start + batchBytes;
    this.out = this.start;
    // Escaped output is at most 6 bytes per UTF-16 unit; the units take 2 bytes each.
    this.maxKernelChars = this.kernels ? Math.floor((batchBytes - 64) / 6) : 0;
  }

  /** Bytes buffered and not yet passed to the sink. */
  get buffered(): number {
    return this.out - this.start;
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
    if (this.out > this.start) {
      const chunk = this.mem.subarray(this.start, this.out);
      this.out = this.start;
      this.sink(chunk);
    }
  }

  private room(n: number): void {
    if (this.out + n > this.end) this.flush();
  }

  private byte(b: number): void {
    if (this.out >= this.end) this.flush();
    this.mem[this.out++] = b;
  }

  // Short pieces (keys, numbers, short strings) are copied by plain JS loops: a call into
  // Buffer#write costs more than the copy itself.

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
    if (s.length * 3 <= this.end - this.start) {
      this.room(s.length * 3);
      this.out += this.mem.write(s, this.out);
    } else {
      this.flush();
      this.sink(Buffer.from(s));
    }
  }

  /** UTF-8 bytes that are already a JSON fragment, any length. */
  private utf8(b: Uint8Array): void {
    if (b.length <= this.end - this.start) {
      this.room(b.length);
      this.mem.set(b, this.out);
      this.out += b.length;
    } else {
      this.flush();
      this.sink(Buffer.from(b.buffer, b.byteOffset, b.length));
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
    // The UTF-16 units are a copy (or a widening) of the string's own storage; the kernel does the rest.
    const mem = this.mem;
    mem.write(s, this.scratchAt, 'utf16le');
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
    if (v instanceof JsonText) return this.utf8(v.bytes);
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
let decodeKernels: JsonKernels | null | undefined;
let decodeMem: Buffer | undefined;

/**
 * UTF-8 JSON text (a line, or LF-separated lines) as a JS string, as cheaply as its content
 * allows: ASCII (the common case) decodes as Latin-1; text with some non-ASCII is first written
 * as ASCII JSON (\uXXXX) by the asciify kernel, which beats V8's UTF-8 decoder several times over.
 */
export function jsonTextOfUtf8(bytes: Buffer): string {
  if (isAscii(bytes)) return bytes.toString('latin1');
  if (!isUtf8(bytes)) throw new LosslessJsonError('invalid JSON: not UTF-8');
  const n = bytes.length;
  if (n <= ASCIIFY_MAX_LINE) {
    decodeKernels ??= instantiateJsonKernels(KERNEL_RESERVED_BYTES + 3 * WASM_PAGE_BYTES) ?? null;
    const k = decodeKernels;
    if (k) {
      const limit = n + (n >> 2) + 64; // past this, non-ASCII is dense: the native decoder wins
      const dst = KERNEL_RESERVED_BYTES + n;
      const need = dst + limit + 64;
      const have = k.memory.buffer.byteLength;
      if (need > have) k.memory.grow(Math.ceil((need - have) / WASM_PAGE_BYTES));
      if (decodeMem?.buffer !== k.memory.buffer) decodeMem = Buffer.from(k.memory.buffer);
      bytes.copy(decodeMem, KERNEL_RESERVED_BYTES);
      const end = k.asciify(KERNEL_RESERVED_BYTES, n, dst, dst + limit);
      if (end >= 0) return decodeMem.toString('latin1', dst, end);
    }
  }
  return bytes.toString('utf8');
}
