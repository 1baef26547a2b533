// The writer of checkpoint_metrics.jsonl (activities/metrics.ts), as the run report reads it:
// stage seconds rounded to the millisecond, one line per checkpoint ID however often a retried
// activity appends it, and a torn last line (a crash mid-write) not glued to the next.
import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { appendCheckpointMetrics, CHECKPOINT_METRICS_FILE, roundedOutcome } from '../../activities/metrics.js';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import { parseCheckpointMetrics } from '../../scripts/report/data.js';
import { tempDir } from '../helpers/temp-dir.js';

const outcome = (id: string, seconds: CheckpointOutcome['seconds'] = { prepare: 0.1 + 0.2, gym_participant_seconds: 0.20600000000000002, total: 1 }) =>
  ({ checkpointId: id, trigger: 'periodic', outcome: 'completed', reason: 'completed', seconds, at: '2026-01-01T00:00:00.000Z' }) satisfies CheckpointOutcome;

const lines = (dir: string): string[] => readFileSync(join(dir, CHECKPOINT_METRICS_FILE), 'utf8').split('\n');

describe('appendCheckpointMetrics', () => {
  it('rounds stage seconds to the millisecond and leaves the rest as it was', () => {
    expect(roundedOutcome(outcome('a'))).toEqual({ ...outcome('a'), seconds: { prepare: 0.3, gym_participant_seconds: 0.206, total: 1 } });
    expect(roundedOutcome(outcome('a', { admission_closed_seconds: 2.0004999 })).seconds).toEqual({ admission_closed_seconds: 2 });
  });

  it('a retried append of the same checkpoint writes nothing more; another checkpoint appends', async () => {
    const dir = join(tempDir('metrics'), 'ckpt');
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('rollout-step-1-snapshot-1-aa') });
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('rollout-step-1-snapshot-1-aa') });
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('rollout-step-1-snapshot-1-a') }); // a prefix of the first: another ID
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('rollout-step-1-snapshot-1-aa') });
    expect(lines(dir).map((l) => (l ? (JSON.parse(l) as CheckpointOutcome).checkpointId : l))).toEqual([
      'rollout-step-1-snapshot-1-aa',
      'rollout-step-1-snapshot-1-a',
      '',
    ]);
    expect(JSON.parse(lines(dir)[0]!).seconds).toEqual({ prepare: 0.3, gym_participant_seconds: 0.206, total: 1 });
  });

  it('skipped attempts (no checkpoint ID) each keep their line, told apart by when they were decided', async () => {
    const dir = join(tempDir('metrics'), 'ckpt');
    const skip = (at: string) => ({ ...outcome(''), outcome: 'skipped' as const, reason: 'missing_trainer_anchor' as const, seconds: {}, at });
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: skip('2026-01-01T00:00:01.000Z') });
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: skip('2026-01-01T00:00:01.000Z') }); // a retry
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: skip('2026-01-01T00:00:09.000Z') });
    expect(lines(dir).filter(Boolean)).toHaveLength(2);
    expect(parseCheckpointMetrics(readFileSync(join(dir, CHECKPOINT_METRICS_FILE), 'utf8')).outcomes).toHaveLength(2);
  });

  it('finds the repeated line at the end of a long file; after a torn line it starts a line of its own', async () => {
    const dir = tempDir('metrics');
    // Older lines fill more than the window searched: the file is not read whole.
    const old = Array.from({ length: 400 }, (_, i) => JSON.stringify(outcome(`old-${i}`))).join('\n');
    writeFileSync(join(dir, CHECKPOINT_METRICS_FILE), `${old}\n`);
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('new') });
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('new') });
    appendFileSync(join(dir, CHECKPOINT_METRICS_FILE), '{"checkpointId":"torn","sec');
    await appendCheckpointMetrics({ checkpointDir: dir, outcome: outcome('after') });
    const parsed = parseCheckpointMetrics(readFileSync(join(dir, CHECKPOINT_METRICS_FILE), 'utf8'));
    expect(parsed).toMatchObject({ lines: 403, duplicates: 0, unreadable: 1 });
    expect(parsed.outcomes.slice(-2).map((o) => o.checkpointId)).toEqual(['new', 'after']);
  });
});
