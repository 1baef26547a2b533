// A compact, lossless encoding of JSON values for state the training run carries across
// continue-as-new. A workflow's continue-as-new input is one Temporal payload (2 MiB hard limit on
// the server and in the SDK, which fails the workflow task — and so every retry — when it is over).
// The run's state grows with the rollouts in flight (~530 bytes each as plain JSON, so ~4,000 in
// flight is over the limit); the bulk of it is the same object shapes and the same strings
// (rollout IDs appear as ledger IDs, in-flight keys and episode IDs) over and over:
//   - every distinct string is stored once, and referenced by index;
//   - every distinct object shape (its key list) is stored once, as indices into the strings.
// Node encoding (unambiguous by JSON type):
//   string → number (index into `strings`)      number → string (its shortest round-trip decimal)
//   boolean, null → itself                       array → [0, ...items]
//   object → [shape index + 1, ...values in the shape's key order]
// Same semantics as JSON.stringify/parse: undefined object properties are dropped, undefined and
// non-finite numbers in arrays become null. Pure and deterministic (workflow-safe).

export interface PackedJson {
  packed: 1;
  strings: string[];
  /** Key lists, as indices into `strings`. */
  shapes: number[][];
  root: unknown;
}

export function isPackedJson(v: unknown): v is PackedJson {
  return typeof v === 'object' && v !== null && (v as { packed?: unknown }).packed === 1 && Array.isArray((v as PackedJson).strings);
}

/** The value itself, unpacked when it came packed (activities accept either form). */
export function unpacked<T>(v: T | PackedJson): T {
  return isPackedJson(v) ? unpackJson<T>(v) : v;
}

export function packJson(value: unknown): PackedJson {
  const strings: string[] = [];
  const stringIndex = new Map<string, number>();
  const shapes: number[][] = [];
  const shapeIndex = new Map<string, number>();
  const str = (s: string): number => {
    let i = stringIndex.get(s);
    if (i === undefined) {
      i = strings.length;
      strings.push(s);
      stringIndex.set(s, i);
    }
    return i;
  };
  const enc = (v: unknown, inArray: boolean): unknown => {
    if (v === null) return null;
    switch (typeof v) {
      case 'string':
        return str(v);
      case 'number':
        return Number.isFinite(v) ? String(v) : null;
      case 'boolean':
        return v;
      case 'object': {
        const withJson = v as { toJSON?: () => unknown };
        if (typeof withJson.toJSON === 'function') return enc(withJson.toJSON(), inArray);
        if (Array.isArray(v)) {
          const out: unknown[] = [0];
          for (const item of v) out.push(enc(item, true) ?? null);
          return out;
        }
        const keys: number[] = [];
        const values: unknown[] = [];
        for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
          const e = enc(x, false);
          if (e === undefined) continue;
          keys.push(str(k));
          values.push(e);
        }
        const id = keys.join(',');
        let s = shapeIndex.get(id);
        if (s === undefined) {
          s = shapes.length;
          shapes.push(keys);
          shapeIndex.set(id, s);
        }
        return [s + 1, ...values];
      }
      default:
        // undefined, functions, symbols: dropped from objects, null in arrays (as JSON does).
        return inArray ? null : undefined;
    }
  };
  const root = enc(value, true);
  return { packed: 1, strings, shapes, root };
}

export function unpackJson<T = unknown>(p: PackedJson): T {
  const { strings, shapes } = p;
  const dec = (v: unknown): unknown => {
    if (v === null || typeof v === 'boolean') return v;
    if (typeof v === 'number') {
      const s = strings[v];
      if (s === undefined) throw new Error(`packed JSON: no string ${v}`);
      return s;
    }
    if (typeof v === 'string') return Number(v);
    if (!Array.isArray(v) || typeof v[0] !== 'number') throw new Error('packed JSON: malformed node');
    if (v[0] === 0) {
      const out: unknown[] = new Array(v.length - 1);
      for (let i = 1; i < v.length; i++) out[i - 1] = dec(v[i]);
      return out;
    }
    const shape = shapes[v[0] - 1];
    if (!shape || shape.length !== v.length - 1) throw new Error(`packed JSON: bad shape ${v[0]}`);
    const out: Record<string, unknown> = {};
    for (let i = 0; i < shape.length; i++) {
      const key = strings[shape[i]!]!;
      const x = dec(v[i + 1]);
      // As JSON.parse: `__proto__` is an own property, not the prototype.
      if (key === '__proto__') Object.defineProperty(out, key, { value: x, enumerable: true, writable: true, configurable: true });
      else out[key] = x;
    }
    return out;
  };
  return dec(p.root) as T;
}
