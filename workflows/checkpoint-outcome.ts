// How a checkpoint attempt's outcome leaves its workflow: a completed one as its result, a failed
// one as the workflow's failure (so the Temporal UI lists it under "Failed"), with the same outcome
// in the failure's details for the run. And the short stage table shown as its current details.
import { ApplicationFailure, ChildWorkflowFailure } from '@temporalio/common';
import {
  CHECKPOINT_STAGE_NAMES,
  CHECKPOINT_STAGES,
  type CheckpointOutcome,
  type CheckpointStage,
  type CheckpointStageSeconds,
} from '../protocol/controller.js';

/** The failure type of a checkpoint attempt that ended failed (its details: the outcome). */
export const CHECKPOINT_FAILED = 'checkpoint_failed';

export function checkpointFailure(o: CheckpointOutcome): ApplicationFailure {
  return ApplicationFailure.create({
    type: CHECKPOINT_FAILED,
    nonRetryable: true,
    message: `checkpoint ${o.checkpointId} failed (${o.reason})${o.error ? `: ${o.error}` : ''}`,
    details: [o],
  });
}

/** The outcome a failed checkpoint attempt carried, if `err` is that failure (else undefined). */
export function outcomeOfFailure(err: unknown): CheckpointOutcome | undefined {
  const cause = err instanceof ChildWorkflowFailure ? err.cause : err;
  if (!(cause instanceof ApplicationFailure) || cause.type !== CHECKPOINT_FAILED) return undefined;
  return cause.details?.[0] as CheckpointOutcome | undefined;
}

const STAGES: Array<[keyof CheckpointStageSeconds, string]> = [
  ...CHECKPOINT_STAGE_NAMES.map((k): [CheckpointStage, string] => [k, CHECKPOINT_STAGES[k]]),
  ['total', 'start to end'],
];

/** Markdown for the Temporal UI: the outcome and each stage's seconds (stages that ran side by side overlap). */
export function checkpointDetails(o: CheckpointOutcome, run: string): string {
  const rows = STAGES.filter(([k]) => o.seconds[k] !== undefined).map(([k, what]) => `| ${k} (${what}) | ${o.seconds[k]!.toFixed(3)} |`);
  return [
    `**${o.trigger} checkpoint** \`${o.checkpointId}\` of run \`${run}\`: **${o.outcome}** (${o.reason})`,
    ...(o.error ? ['', `error: ${o.error}`] : []),
    ...(o.snapshotDir ? ['', `snapshot: \`${o.snapshotDir}\``] : []),
    '',
    '| stage | seconds |',
    '| --- | ---: |',
    ...rows,
  ].join('\n');
}
