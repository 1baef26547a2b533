// The deferred restore's second core (storage.ts `readRecords` with `defer`): reads a records
// file, parses and checks every line, and hands the main thread the bytes in whole-line chunks
// plus, for each in-scope line, either an envelope (the record without its deferred field, as
// JSON text) or "parse this one yourself". The main thread hashes the chunks, builds the records
// and makes every refusal, so the errors are the inline reader's; this thread only proves lines
// good. Its parse results die young: nothing it allocates survives, so its GC is cheap.
import { closeSync, openSync, readSync } from 'node:fs';
import { parentPort } from 'node:worker_threads';
import { captureKey } from '../../protocol/episode-id.js';
import { jsonTextOfUtf8, nativeIsLossless } from '../../protocol/lossless-json.js';
import { decodeEpisodeId, isPlainObject } from './record-episode.js';

export interface ScanRequest {
  id: number;
  file: string;
  /** The byte range to scan: starts at a line's start, ends after an LF or at the end of the file. */
  start: number;
  end: number;
  /** Capture keys in scope; null = every record. */
  scope: string[] | null;
  field: string;
  chunkBytes: number;
  /** Int32 flag the main thread sets to 1 to stop the scan. */
  cancel: SharedArrayBuffer;
}

/** One whole-line chunk of the file, in file order (the chunks concatenated are the file). */
export interface ScanChunk {
  id: number;
  bytes: ArrayBuffer;
  /** Bytes of `bytes` that are file content (from offset 0). */
  length: number;
  /** Lines in this chunk (a final line without LF included). */
  lines: number;
  /** Per noted line: [line number (1-based, within the scanned range), start, end (within the chunk, LF excluded), envelope index or -1]. */
  noted: number[];
  envelopes: string[];
}

export type ScanReply = ScanChunk | { id: number; done: true } | { id: number; error: string; code?: string };

const port = parentPort;
if (port) {
  port.on('message', (req: ScanRequest) => {
    try {
      scan(req, (m, transfer) => port.postMessage(m, transfer ?? []));
      port.postMessage({ id: req.id, done: true } satisfies ScanReply);
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      port.postMessage({ id: req.id, error: e?.message ?? String(err), code: e?.code } satisfies ScanReply);
    }
  });
}

function scan(req: ScanRequest, send: (m: ScanReply, transfer?: ArrayBuffer[]) => void): void {
  const cancel = new Int32Array(req.cancel);
  const scope = req.scope ? new Set(req.scope) : null;
  const fd = openSync(req.file, 'r');
  try {
    let carry: Buffer | undefined;
    let lineNo = 0;
    let eof = false;
    let position = req.start;
    while (!eof && Atomics.load(cancel, 0) === 0) {
      // Fresh memory per chunk: it is transferred to the main thread, which may keep views into it.
      let size = Math.max(req.chunkBytes, (carry?.length ?? 0) * 2);
      let buf = Buffer.from(new ArrayBuffer(size));
      let filled = carry ? carry.copy(buf, 0) : 0;
      carry = undefined;
      let last = -1;
      for (;;) {
        const want = Math.min(buf.length - filled, req.end - position);
        const n = want > 0 ? readSync(fd, buf, filled, want, position) : 0;
        position += n;
        if (n === 0) {
          eof = true;
          break;
        }
        filled += n;
        last = buf.lastIndexOf(10, filled - 1);
        if (last >= 0 && filled === buf.length) break;
        if (filled === buf.length) {
          // One line longer than the chunk: grow.
          size *= 2;
          const bigger = Buffer.from(new ArrayBuffer(size));
          buf.copy(bigger, 0, 0, filled);
          buf = bigger;
        }
      }
      if (filled === 0) break;
      // Whole lines go out now; the tail waits for the next read (at EOF it is the last line).
      const cut = eof ? filled : last + 1;
      if (cut < filled) carry = Buffer.from(buf.subarray(cut, filled));
      const chunk = buf.subarray(0, cut);
      const noted: number[] = [];
      const envelopes: string[] = [];
      const lines = scanLines(chunk, lineNo, scope, req.field, noted, envelopes);
      lineNo += lines;
      // The carry was copied out above: the whole buffer moves, `length` says what counts.
      const bytes = buf.buffer as ArrayBuffer;
      send({ id: req.id, bytes, length: cut, lines, noted, envelopes }, [bytes]);
    }
  } finally {
    closeSync(fd);
  }
}

/** Lines of `chunk` (whole lines, the last one may lack its LF); returns how many. */
function scanLines(chunk: Buffer, before: number, scope: Set<string> | null, field: string, noted: number[], envelopes: string[]): number {
  let text: string | undefined;
  try {
    // Non-ASCII becomes \uXXXX: one-byte text, and a chunk over ~1 MB is an external string.
    text = jsonTextOfUtf8(chunk);
  } catch {
    // Not UTF-8 somewhere: every line goes to the main thread, which names the bad one.
  }
  let n = 0;
  let start = 0; // byte offset of the current line
  let p = 0; // its offset in `text`
  while (start < chunk.length) {
    let end = chunk.indexOf(10, start);
    if (end < 0) end = chunk.length;
    n++;
    let q = -1;
    if (text !== undefined) {
      q = text.indexOf('\n', p);
      if (q < 0) q = text.length;
    }
    const line = before + n;
    const envelope = text !== undefined ? lineEnvelope(text.slice(p, q), scope, field) : PUNT;
    if (envelope === PUNT) noted.push(line, start, end, -1);
    else if (envelope !== OUT_OF_SCOPE) noted.push(line, start, end, envelopes.push(envelope) - 1);
    start = end + 1;
    p = q + 1;
  }
  // An empty final line (the file ends with LF) is not a line.
  return n;
}

const PUNT = Symbol('punt');
const OUT_OF_SCOPE = Symbol('out of scope');

/** The record without `field` as JSON text; PUNT when the main thread must look at the line itself. */
function lineEnvelope(text: string, scope: Set<string> | null, field: string): string | typeof PUNT | typeof OUT_OF_SCOPE {
  // Lines native JSON.parse would read differently (NaN tokens, 1.0, big integers, index keys)
  // and lines that are not JSON or lack an episode: the main thread's parser decides.
  if (!nativeIsLossless(text)) return PUNT;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return PUNT;
  }
  if (!isPlainObject(value)) return PUNT;
  const ep = decodeEpisodeId(value.episode_id);
  if (!ep) return PUNT;
  if (scope && !scope.has(captureKey(ep))) return OUT_OF_SCOPE;
  if (!Object.prototype.hasOwnProperty.call(value, field)) return PUNT;
  const rest: Record<string, unknown> = {};
  for (const k of Object.keys(value)) {
    if (k === '__proto__') return PUNT; // an assignment would set the prototype, not the key
    if (k !== field) rest[k] = value[k];
  }
  return JSON.stringify(rest);
}
