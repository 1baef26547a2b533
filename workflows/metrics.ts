// The controller's own metrics, emitted through the SDK's workflow meter: they come out of the
// worker's Prometheus endpoint beside the SDK's (worker.ts --metrics-address). The SDK skips them
// on replay and they add nothing to the history, so workflow files call these helpers freely.
// Labels take values from fixed sets only: never a run, rollout, capture key or checkpoint ID
// (a long-lived worker serves many runs, and its series are never dropped). The SDK adds
// `namespace`, `taskQueue` and `workflowType` (its tag names for custom metrics).
import { metricMeter } from '@temporalio/workflow';
import { CHECKPOINT_STAGE_NAMES, type CheckpointOutcome, type CheckpointStage, type CheckpointStageSeconds } from '../protocol/controller.js';

export const METRICS = {
  checkpoints: 'controller_checkpoints_total',
  checkpointStageSeconds: 'controller_checkpoint_stage_seconds',
  gymParticipantSeconds: 'controller_checkpoint_gym_participant_seconds',
  rolloutsDispatched: 'controller_rollouts_dispatched_total',
  rolloutsCompleted: 'controller_rollouts_completed_total',
  rolloutsFailed: 'controller_rollouts_failed_total',
  recoveries: 'controller_recoveries_total',
  recoveryEpisodes: 'controller_recovery_episodes_total',
} as const;

/** The stages of an outcome's `seconds` record, by their `stage` label (the participants' sum has its own histogram). */
const STAGES: Array<[keyof CheckpointStageSeconds, string]> = [
  ...CHECKPOINT_STAGE_NAMES.map((k): [CheckpointStage, string] => [k, k]),
  ['admission_closed_seconds', 'admission_closed'],
  ['total', 'total'],
];

const counter = (name: string, help: string) => metricMeter.createCounter(name, '', help);
const seconds = (name: string, help: string) => metricMeter.createHistogram(name, 'float', 's', help);

/** A checkpoint outcome the run recorded (every one it keeps, as in checkpoint_metrics.jsonl). */
export function checkpointRecorded(o: CheckpointOutcome): void {
  counter(METRICS.checkpoints, 'Checkpoint outcomes recorded by the run.').add(1, { outcome: o.outcome, reason: o.reason, trigger: o.trigger });
  const stages = seconds(METRICS.checkpointStageSeconds, 'Seconds of each stage of a checkpoint attempt, and admission closed.');
  for (const [key, stage] of STAGES) {
    const s = o.seconds[key];
    if (s !== undefined && s >= 0) stages.record(s, { stage, outcome: o.outcome });
  }
  const gym = o.seconds.gym_participant_seconds;
  if (gym !== undefined && gym >= 0) {
    seconds(METRICS.gymParticipantSeconds, 'Seconds a checkpoint attempt spent in Gym calls (prepare + commit + resume).').record(gym, { outcome: o.outcome });
  }
}

/** Attempts a shard started (each rollout attempt workflow). */
export function rolloutsDispatched(n: number): void {
  if (n > 0) counter(METRICS.rolloutsDispatched, 'Rollout attempts started by the shards.').add(n);
}

/**
 * Runs `apply` (which only adds to the shard's `completed` and `failed`) and counts what it added:
 * results sealed, and live failures charged to their sibling.
 */
export function countingRollouts<T>(st: { completed: number; failed: number }, apply: () => T): T {
  const before = { completed: st.completed, failed: st.failed };
  const out = apply();
  const completed = st.completed - before.completed;
  const failed = st.failed - before.failed;
  if (completed > 0) counter(METRICS.rolloutsCompleted, 'Rollout results sealed by the shards.').add(completed);
  if (failed > 0) counter(METRICS.rolloutsFailed, 'Rollout attempts failed and charged to their sibling.').add(failed);
  return out;
}

export type RestoreResult = 'restored' | 'restore_failed' | 'nothing_to_restore';

/** A recovery the run finished, and what became of the unfinished episodes. */
export function recoveryRecorded(cold: boolean, restore: RestoreResult, continued: number, restarted: number): void {
  counter(METRICS.recoveries, 'Recoveries finished (after a Gym crash, or a cold start on a checkpoint).').add(1, {
    kind: cold ? 'cold_start' : 'gym_crash',
    restore,
  });
  const episodes = counter(METRICS.recoveryEpisodes, 'Unfinished episodes of a recovery: continued from a saved turn, or restarted.');
  if (continued > 0) episodes.add(continued, { result: 'continued' });
  if (restarted > 0) episodes.add(restarted, { result: 'restarted' });
}
