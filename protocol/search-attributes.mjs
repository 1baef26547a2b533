// The custom search attributes our workflows set, so the Temporal UI's list and
// `temporal workflow list --query` tell a run's story (README "Finding things in the Temporal
// UI"). Plain JavaScript: the dev-server launcher (plain Node), the worker's registration check and
// the workflows (workflows/search-attributes.ts) read this one table. A cluster must have every one
// registered before a workflow sets it: a start or upsert of an unknown attribute is refused.

/** Name → Temporal's indexed value type, and what it says. */
export const SEARCH_ATTRIBUTES = Object.freeze({
  /** Every workflow of a run: the run itself, its shards, its checkpoint and rollout attempts. */
  RunName: 'Keyword',
  /** The training run: dispatching, paused, recovering, waiting_for_gym, release_pending, abort_pending, stopping, finished, failed. */
  RunPhase: 'Keyword',
  /** The run: its trainer step; a checkpoint attempt: the step it binds to. */
  TrainerStep: 'Int',
  /** A checkpoint attempt: periodic, manual, trainer_boundary… */
  CheckpointTrigger: 'Keyword',
  /** A checkpoint attempt: running, completed or failed. */
  CheckpointOutcome: 'Keyword',
  /** A checkpoint attempt: completed, or why it failed (timeout, io_error, release_pending…). */
  CheckpointReason: 'Keyword',
  /** A rollout attempt: running, completed, failed, timed_out or retired. */
  RolloutStatus: 'Keyword',
  /** A rollout attempt: its reward once it completed. */
  RolloutReward: 'Double',
  /** A rollout attempt that continues an episode from a saved turn (not from its input). */
  RolloutContinued: 'Bool',
});

/** The operator API's IndexedValueType numbers. */
export const INDEXED_VALUE_TYPE = Object.freeze({ Text: 1, Keyword: 2, Int: 3, Double: 4, Bool: 5, Datetime: 6, KeywordList: 7 });
