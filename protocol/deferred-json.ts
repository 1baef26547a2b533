// A JSON value read from a records line but not yet materialized (control-plane.md §9.6 with a
// deferred field): the restore verified the line (digest, UTF-8, JSON, lossless model, episode,
// scope) before handing it out; parsing it into objects waits until someone reads it. Large
// session states parsed eagerly held the Gym paused for the parse and the garbage collector's
// copying (`npm run bench -- storage`, the 350 KB sessions).
import { jsonTextOfUtf8, parseLossless, type LosslessValue } from './lossless-json.js';

export class DeferredJson {
  #line: Buffer | undefined;
  readonly #field: string;
  #value: LosslessValue | undefined;

  /** `line`: the UTF-8 record line (verified); `field`: the top-level field this value is. */
  constructor(line: Buffer, field: string) {
    this.#line = line;
    this.#field = field;
  }

  /** Bytes still held (0 once materialized). */
  get pendingBytes(): number {
    return this.#line?.length ?? 0;
  }

  /** The value (lossless model); parsed on the first call, then kept and the bytes dropped. */
  value(): LosslessValue {
    const line = this.#line;
    if (line !== undefined) {
      const record = parseLossless(jsonTextOfUtf8(line)) as Record<string, LosslessValue>;
      this.#value = record[this.#field];
      this.#line = undefined;
    }
    return this.#value as LosslessValue;
  }

  /** Writers (JSON.stringify, the lossless writers) write the value. */
  toJSON(): LosslessValue {
    return this.value();
  }
}

/** `v` itself, or the value of a deferred one. */
export function materialized(v: unknown): unknown {
  return v instanceof DeferredJson ? v.value() : v;
}
