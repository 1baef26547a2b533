// The typed keys of the search attributes the workflows set (the table and what each one means:
// protocol/search-attributes.mjs; registered by the worker at start, scripts/search-attributes.mjs).
// Each workflow sets its own at its start (children get theirs from their parent's start command)
// and upserts only what changes: an upsert is a history event and a visibility write.
import { defineSearchAttributeKey, SearchAttributeType, type SearchAttributePair } from '@temporalio/common';
import { SEARCH_ATTRIBUTES } from '../protocol/search-attributes.mjs';

type Table = typeof SEARCH_ATTRIBUTES;
const SDK_TYPE = {
  Keyword: SearchAttributeType.KEYWORD,
  Int: SearchAttributeType.INT,
  Double: SearchAttributeType.DOUBLE,
  Bool: SearchAttributeType.BOOL,
} as const;
type SdkType<N extends keyof Table> = (typeof SDK_TYPE)[Table[N]];

function key<N extends keyof Table>(name: N) {
  return defineSearchAttributeKey(name, SDK_TYPE[SEARCH_ATTRIBUTES[name]] as SdkType<N>);
}

export const RUN_NAME = key('RunName');
export const RUN_PHASE = key('RunPhase');
export const TRAINER_STEP = key('TrainerStep');
export const CHECKPOINT_TRIGGER = key('CheckpointTrigger');
export const CHECKPOINT_OUTCOME = key('CheckpointOutcome');
export const CHECKPOINT_REASON = key('CheckpointReason');
export const ROLLOUT_STATUS = key('RolloutStatus');
export const ROLLOUT_REWARD = key('RolloutReward');
export const ROLLOUT_CONTINUED = key('RolloutContinued');

/** A workflow of run `run` (its shards). */
export function ofRun(run: string): SearchAttributePair[] {
  return [{ key: RUN_NAME, value: run }];
}

/** The documented queries of a run (README "Finding things in the Temporal UI"), for the UI's search box or `temporal workflow list --query`. */
export function runQueries(run: string) {
  const name = `RunName = '${run.replace(/'/g, "\\'")}'`;
  return {
    /** Every workflow of the run. */
    all: name,
    /** Its failed checkpoint attempts. */
    failedCheckpoints: `${name} AND WorkflowType = 'checkpointAttempt' AND ExecutionStatus = 'Failed'`,
    /** Its rollout attempts that continued an episode from a saved turn. */
    continuedAttempts: `${name} AND RolloutContinued = true`,
    /** Its rollout attempts that did not complete. */
    unfinishedAttempts: `${name} AND WorkflowType = 'rolloutAttempt' AND RolloutStatus != 'completed'`,
  };
}
