// The trainer role: what the training-run workflow asks of a trainer. Four activities on the run's
// task queue (`run.task_queue`), plain JSON in and out. Our tiny GRPO trainer plays it
// (activities/trainer.ts, `trainer: tiny_grpo`). An external trainer (NeMo RL, verl) plays it with
// `trainer: external` by registering activities of these names on the run's task queue in place of
// ours: in TypeScript, `{...createActivities(deps), ...itsTrainer}` in its own worker; in Python,
// Temporal's Python SDK with `@activity.defn(name="trainStep")` and the same JSON. The workflow
// never reads weights; it keeps the batches since the newest anchor and the versions.
//
// What the workflow relies on:
//
// trainStep(TrainStepInput) → TrainStepResult
//   One optimizer step on `batch` (groups of siblings: `reward`, `mask`, and `captureKeys`, the
//   attempts whose model calls form the trajectory; activities/rollout-batches.ts `trajectoryCalls`
//   reads those calls from the policy model server's capture, as token IDs or text). The trainer
//   must hold version `expectedVersion` before and returns `version: expectedVersion + 1` after it
//   has made every inference server serve the new weights (the refit): rollouts dispatched after
//   the step returns use them. The workflow closes admission (its weight-sync gate) meanwhile.
//   At least once: the same input after a success returns the same result (and refits again).
//   A trainer that lost its state (a crash) and holds an older version fails non-retryably with
//   type `trainer_behind` and details `{step}` of the anchor it came back from: the workflow sends
//   the batches after that anchor again, in order, then this one. One that holds a newer version
//   fails with `trainer_ahead`.
//
// saveTrainerCheckpoint(SaveTrainerCheckpointInput) → SavedTrainerCheckpoint
//   A durable trainer anchor of `step` (weights, optimizer state, `cursor`), called every
//   `checkpointing.save_period` steps; a Gym-aware snapshot is then taken at that step and bound to
//   it. With `gymRestartFallback`, the same call writes `<checkpoint_dir>/step_<N>/
//   gym_restart_fallback.json` once the anchor is durable (writeGymRestartFallbackMarker in trainer.ts
//   does it for a TypeScript trainer): a cold start may then use the anchor without Gym state. At least once:
//   an anchor already durable with this cursor is answered as saved.
//
// latestTrainerAnchor({checkpointDir, run?}) → {anchor: "step_<N>", step, version, cursor, skipped} | null
//   The newest anchor that is valid, for a cold start (`restore_mode: latest`).
//
// restoreTrainer({run, checkpointDir, anchor?, adopt?, backendUrl?}) → {version, step, cursor, anchor, skipped}
//   Load that anchor (`bootstrap`: the initial weights), refit, and answer what it holds. `adopt`:
//   the anchor was written by another run that this one takes over. `backendUrl` is our tiny
//   inference server when the deployment has one; an external trainer refits its own servers.
import type {
  RestoreTrainerInput,
  RestoredTrainer,
  SaveTrainerCheckpointInput,
  SavedTrainerCheckpoint,
  TrainerAnchorInfo,
  TrainStepInput,
  TrainStepResult,
} from './trainer.js';

export interface TrainerRole {
  trainStep(input: TrainStepInput): Promise<TrainStepResult>;
  saveTrainerCheckpoint(input: SaveTrainerCheckpointInput): Promise<SavedTrainerCheckpoint>;
  latestTrainerAnchor(input: { checkpointDir: string; run?: string }): Promise<TrainerAnchorInfo | null>;
  restoreTrainer(input: RestoreTrainerInput): Promise<RestoredTrainer>;
}

export type { RestoreTrainerInput, RestoredTrainer, SaveTrainerCheckpointInput, SavedTrainerCheckpoint, TrainerAnchorInfo, TrainStepInput, TrainStepResult };
