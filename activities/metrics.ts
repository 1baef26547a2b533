// Checkpoint outcomes as JSON lines in `<checkpoint_dir>/checkpoint_metrics.jsonl`
// (docs/controller.md "Outcomes"), one line per attempt, for offline inspection.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { CheckpointOutcome } from '../protocol/controller.js';
import { invariantFailure, storageFailure } from './activity-context.js';

export const CHECKPOINT_METRICS_FILE = 'checkpoint_metrics.jsonl';

export interface AppendCheckpointMetricsInput {
  checkpointDir: string;
  outcome: CheckpointOutcome;
}

/**
 * Appends one line (fsynced). A retried activity whose first run had appended already writes the
 * line again: readers de-duplicate by (checkpointId, at) if they care.
 */
export async function appendCheckpointMetrics(input: AppendCheckpointMetricsInput): Promise<void> {
  const text = input.outcome === undefined ? undefined : JSON.stringify(input.outcome);
  if (text === undefined) throw invariantFailure('checkpoint outcome is not JSON');
  const file = path.join(input.checkpointDir, CHECKPOINT_METRICS_FILE);
  try {
    await fsp.mkdir(input.checkpointDir, { recursive: true });
    const fh = await fsp.open(file, 'a');
    try {
      await fh.write(`${text}\n`);
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
