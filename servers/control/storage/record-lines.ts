// Records lines → records (§9.4, §9.6 step 3): each line UTF-8 JSON with a valid episode; out-of-scope
// lines are dropped, in-scope ones validated by the participant kind and kept, in file order.
import { ProtocolError, refuse } from '../../../protocol/errors.js';
import { captureKey, decodeEpisodeId, type CaptureKey } from '../../../protocol/ids.js';
import { DeferredJson } from '../../../protocol/deferred-json.js';
import { jsonTextOfUtf8, parseLossless } from '../../../protocol/lossless-json.js';
import type { CheckpointRecord } from '../../../protocol/manifest.js';
import type { ScannedChunk } from './worker.js';

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/** Lines in a chunk of whole lines (the last one may lack its LF: it still counts, as in the reference). */
export function linesIn(chunk: Buffer): number {
  let n = 0;
  for (let nl = chunk.indexOf(10); nl >= 0; nl = chunk.indexOf(10, nl + 1)) n += 1;
  return chunk.length > 0 && chunk[chunk.length - 1] !== 10 ? n + 1 : n;
}

export class RecordLines {
  /** Lines seen so far (the number of the last one). */
  count = 0;
  readonly kept: CheckpointRecord[] = [];

  constructor(
    private readonly file: string,
    private readonly scope: ReadonlySet<CaptureKey> | null,
    private readonly validate: ((record: CheckpointRecord) => unknown) | undefined,
  ) {}

  /** Every line of a chunk of whole lines, parsed here. */
  parseChunk(chunk: Buffer): void {
    for (let start = 0; start < chunk.length; ) {
      let end = chunk.indexOf(10, start);
      if (end < 0) end = chunk.length;
      this.parseLine(chunk.subarray(start, end), ++this.count);
      start = end + 1;
    }
  }

  /**
   * A chunk the scan worker proved: its in-scope lines come as envelopes (the record without the
   * deferred `field`, whose bytes stay unparsed) or, where native JSON would misread them, are parsed here.
   */
  takeScanned(chunk: Buffer, scanned: ScannedChunk, field: string): void {
    const { noted, envelopes } = scanned;
    let keptBytes = 0;
    for (let i = 0; i < noted.length; i += 4) if (noted[i + 3]! >= 0) keptBytes += noted[i + 2]! - noted[i + 1]!;
    // Views keep the whole chunk alive: copy the lines out when they are the smaller part of it.
    const copy = keptBytes * 2 < chunk.length;
    for (let i = 0; i < noted.length; i += 4) {
      const line = chunk.subarray(noted[i + 1]!, noted[i + 2]!);
      if (noted[i + 3]! < 0) {
        this.parseLine(line, this.count + noted[i]!);
        continue;
      }
      const record = JSON.parse(envelopes[noted[i + 3]!]!) as CheckpointRecord;
      const ep = decodeEpisodeId(record.episode_id)!; // the worker checked it
      record.episode_id = ep;
      record[field] = new DeferredJson(copy ? Buffer.from(line) : line, field);
      this.keep(record, captureKey(ep));
    }
    this.count += scanned.lines;
  }

  private parseLine(bytes: Buffer, n: number): void {
    let value: unknown;
    try {
      value = parseLossless(jsonTextOfUtf8(bytes));
    } catch (err) {
      throw refuse('invalid_checkpoint_state', `line ${n} of ${this.file} is not JSON: ${(err as Error).message}`);
    }
    const ep = isPlainObject(value) ? decodeEpisodeId(value.episode_id) : undefined;
    if (!ep) throw refuse('invalid_checkpoint_state', `line ${n} of ${this.file} has no valid episode_id`);
    const key = captureKey(ep);
    if (this.scope && !this.scope.has(key)) return;
    const record = value as CheckpointRecord;
    record.episode_id = ep;
    this.keep(record, key);
  }

  private keep(record: CheckpointRecord, key: CaptureKey): void {
    if (this.validate) {
      try {
        this.validate(record);
      } catch (err) {
        const why = err instanceof ProtocolError ? err.detail : ((err as Error)?.message ?? String(err));
        throw refuse('invalid_checkpoint_state', `the record of episode ${key} is invalid: ${why}`);
      }
    }
    this.kept.push(record);
  }
}
