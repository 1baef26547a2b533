// Checkpoint outcomes as JSON lines in `<checkpoint_dir>/checkpoint_metrics.jsonl`
// (docs/controller.md "Outcomes"), one line per attempt, for offline inspection (and the run
// report, scripts/report.ts).
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type CheckpointOutcome, outcomeKey } from '../protocol/controller.js';
import { invariantFailure, storageFailure } from './activity-context.js';

export const CHECKPOINT_METRICS_FILE = 'checkpoint_metrics.jsonl';

/**
 * How much of the file's end is searched for the line a retry would repeat. The run awaits each
 * append before it records the next outcome, so a retried append finds its first run's line last.
 */
const DUPLICATE_WINDOW_BYTES = 64 * 1024;

export interface AppendCheckpointMetricsInput {
  checkpointDir: string;
  outcome: CheckpointOutcome;
}

/** Stage seconds to the millisecond: the workflow's sums carry float noise (0.20600000000000002). */
export function roundedOutcome(o: CheckpointOutcome): CheckpointOutcome {
  const seconds: Record<string, number> = {};
  for (const [k, v] of Object.entries(o.seconds)) if (typeof v === 'number') seconds[k] = Math.round(v * 1000) / 1000;
  return { ...o, seconds };
}

/** The end of the file (its last lines), or '' when there is none yet; `whole` when nothing was cut. */
async function readTail(file: string): Promise<{ text: string; whole: boolean }> {
  let fh: fsp.FileHandle;
  try {
    fh = await fsp.open(file, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { text: '', whole: true };
    throw err;
  }
  try {
    const { size } = await fh.stat();
    const start = Math.max(0, size - DUPLICATE_WINDOW_BYTES);
    const buf = Buffer.alloc(size - start);
    await fh.read(buf, 0, buf.length, start);
    return { text: buf.toString('utf8'), whole: start === 0 };
  } finally {
    await fh.close();
  }
}

/**
 * Appends one line (fsynced), its stage seconds rounded to the millisecond. Idempotent by
 * `outcomeKey`: a retried activity whose first run had appended already finds that line and
 * writes nothing.
 */
export async function appendCheckpointMetrics(input: AppendCheckpointMetricsInput): Promise<void> {
  const text = input.outcome === undefined ? undefined : JSON.stringify(roundedOutcome(input.outcome));
  if (text === undefined) throw invariantFailure('checkpoint outcome is not JSON');
  const file = path.join(input.checkpointDir, CHECKPOINT_METRICS_FILE);
  try {
    await fsp.mkdir(input.checkpointDir, { recursive: true });
    const tail = await readTail(file);
    const lines = tail.text.split('\n');
    // A window that starts mid-file starts mid-line: its first piece is not a line.
    for (const line of tail.whole ? lines : lines.slice(1)) {
      if (!line.includes(input.outcome.at)) continue;
      try {
        if (outcomeKey(JSON.parse(line) as CheckpointOutcome) === outcomeKey(input.outcome)) return;
      } catch {
        // A torn line (a crash mid-write) is not this outcome's.
      }
    }
    const fh = await fsp.open(file, 'a');
    try {
      // After a torn last line, start a line of our own rather than finish that one.
      await fh.write(`${tail.text && !tail.text.endsWith('\n') ? '\n' : ''}${text}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch (err) {
    throw storageFailure(`appending to ${file}`, err);
  }
}

export function createMetricsActivities() {
  return { appendCheckpointMetrics };
}
