// A JSON value already written as text (by `JSON.stringify`): the lossless writers emit the text
// as it is instead of walking a parsed copy. A participant whose state must go out in its wire
// form (the environment's boundaries) stringified it, parsed that back and had the records writer
// encode the copy: three passes and a garbage object tree per record at every commit.

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

export class JsonText {
  /**
   * The text as UTF-8, encoded once: a commit copies these bytes into its batch instead of
   * encoding the text again, and they live outside the JS heap, which a collection does not walk.
   * A buffer of their own, never a slice of Node's shared pool (a kept slice keeps its whole slab).
   */
  readonly bytes: Uint8Array;

  /** `text` must be one JSON value, as `JSON.stringify` returns it. */
  constructor(text: string) {
    this.bytes = utf8.encode(text);
  }

  /** The text (decoded again: for the rare caller that needs it as a string). */
  get text(): string {
    return fromUtf8.decode(this.bytes);
  }

  /** For callers that hand a record to plain `JSON.stringify`: the value itself. */
  toJSON(): unknown {
    return JSON.parse(this.text);
  }
}

/** Text by the object it was made from: for values that never change once made (a new one replaces them). */
const texts = new WeakMap<object, JsonText>();

/**
 * `key`'s JSON text, made by `stringify` the first time and kept while `key` lives: a record parked
 * across several checkpoints (a long tool call, a long generation) is not serialized again while
 * admission is closed. Only for values that are never mutated once made.
 */
export function jsonTextOnce(key: object, stringify: () => string): JsonText {
  let text = texts.get(key);
  if (text === undefined) {
    text = new JsonText(stringify());
    texts.set(key, text);
  }
  return text;
}

/** Whether `key`'s text was made already (`jsonTextOnce`). */
export function hasJsonText(key: object): boolean {
  return texts.has(key);
}
