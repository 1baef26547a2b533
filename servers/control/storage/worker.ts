// The scan threads (run by piscina, see workers.ts): `scan` proves a chunk of
// records lines good (UTF-8, JSON, episode, scope) so the main thread keeps the deferred field's
// bytes unparsed; lines native JSON would misread (NaN, 1.0, big integers, index keys) and bad
// lines go back to the main thread, which parses them and names the error as the eager read does.
import { captureKey, decodeEpisodeId } from '../../../protocol/episode-id.js';
import { jsonTextOfUtf8, nativeIsLossless } from '../../../protocol/lossless-json.js';

export interface ScanTask {
  /** Whole lines (shared memory: read here without a copy). */
  chunk: Uint8Array;
  /** Capture keys in scope; null = every record. */
  scope: string[] | null;
  field: string;
}

export interface ScannedChunk {
  /** Lines in the chunk. */
  lines: number;
  /** Per in-scope line: [line number in the chunk (1-based), start, end (LF excluded), envelope index or -1 (parse it yourself)]. */
  noted: number[];
  /** The records without their deferred field, as JSON text. */
  envelopes: string[];
}

export function scan({ chunk, scope, field }: ScanTask): ScannedChunk {
  const bytes = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  const inScope = scope ? new Set(scope) : null;
  const out: ScannedChunk = { lines: 0, noted: [], envelopes: [] };
  for (let start = 0; start < bytes.length; ) {
    let end = bytes.indexOf(10, start);
    if (end < 0) end = bytes.length;
    out.lines += 1;
    const envelope = lineEnvelope(bytes.subarray(start, end), inScope, field);
    if (envelope === undefined) out.noted.push(out.lines, start, end, -1);
    else if (envelope !== null) out.noted.push(out.lines, start, end, out.envelopes.push(envelope) - 1);
    start = end + 1;
  }
  return out;
}

/** The record without `field` as JSON text; null when out of scope; undefined when the main thread must parse it. */
function lineEnvelope(line: Buffer, scope: Set<string> | null, field: string): string | null | undefined {
  let value: unknown;
  try {
    const text = jsonTextOfUtf8(line);
    if (!nativeIsLossless(text)) return undefined;
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return undefined;
  const record = value as Record<string, unknown>;
  const ep = decodeEpisodeId(record.episode_id);
  if (!ep || Object.hasOwn(record, '__proto__')) return undefined;
  if (scope && !scope.has(captureKey(ep))) return null;
  if (!Object.hasOwn(record, field)) return undefined;
  record[field] = undefined; // JSON.stringify skips it
  return JSON.stringify(record);
}
