// The one canonical JSON of the project: Python's `json.dumps(v, sort_keys=True, separators=(",", ":"))`,
// which the protocol's digests (task_digest, inventory_digest) are defined over (control-plane.md §9.6).
// Not npm `canonicalize` (RFC 8785): it writes non-ASCII raw and sorts keys by UTF-16 unit, so any
// non-ASCII text or astral key gives another digest than the Python participants compute.

/** Python's `sort_keys`: code-point order (JS `<` compares UTF-16 units, which differs above U+FFFF). */
export function compareCodePoints(a: string, b: string): number {
  const ia = a[Symbol.iterator]();
  const ib = b[Symbol.iterator]();
  for (;;) {
    const x = ia.next();
    const y = ib.next();
    if (x.done || y.done) return x.done && y.done ? 0 : x.done ? -1 : 1;
    const d = x.value.codePointAt(0)! - y.value.codePointAt(0)!;
    if (d !== 0) return d;
  }
}

function asciiString(s: string): string {
  // JSON.stringify already escapes controls and lone surrogates; Python's ensure_ascii also
  // escapes DEL and everything above it (astral characters as surrogate pairs).
  return JSON.stringify(s).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/**
 * `json.dumps(v, sort_keys=True, separators=(",", ":"))` for JSON data. Floats are rendered the JS
 * way (`1` not `1.0`): design.md decides Python float rendering is not required. Non-finite
 * numbers and values with no JSON form are refused (TypeError); `undefined` properties are skipped.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'string') return asciiString(value);
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new TypeError(`canonicalJson: ${value} is not valid JSON`);
    return JSON.stringify(value);
  }
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (Array.isArray(value)) return `[${value.map((v) => (v === undefined ? 'null' : canonicalJson(v))).join(',')}]`;
  if (typeof value === 'object') {
    const obj = value as Record<string, unknown>;
    const keys = Object.keys(obj)
      .filter((k) => obj[k] !== undefined)
      .sort(compareCodePoints);
    return `{${keys.map((k) => `${asciiString(k)}:${canonicalJson(obj[k])}`).join(',')}}`;
  }
  throw new TypeError(`canonicalJson: cannot encode a ${typeof value}`);
}

/**
 * Keys sorted at every level (arrays keep their order): the layout of the files we write with
 * `JSON.stringify(sortKeysDeep(v), null, 1)` (manifests, trainer files), so equal content is equal text.
 */
export function sortKeysDeep(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeysDeep);
  if (v !== null && typeof v === 'object') {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort(compareCodePoints)) {
      // defineProperty: a `__proto__` key stays a key.
      Object.defineProperty(out, k, { value: sortKeysDeep((v as Record<string, unknown>)[k]), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  return v;
}
