// The recovery ledger's shape (controller.md §5): what the shards hold in their state and a
// snapshot persists as its ledger parts. Its transitions are in ledger.ts.
import type { TaskRef } from '../protocol/controller.js';

export const LEDGER_SCHEMA_VERSION = 1;

export type AttemptStatus = 'reserved' | 'dispatched' | 'sealed' | 'failed' | 'abandoned';
export type GroupStatus = 'generating' | 'ready_to_finalize' | 'consumed';
export type RecoveryGranularity = 'sibling' | 'prompt_group';
export type TargetLevel = 'turn' | 'sibling' | 'prompt_group';

export interface Attempt {
  /** Gym attempt number N: capture key `r` (N = 0) or `r-aN`. */
  gym_attempt: number;
  status: AttemptStatus;
  /** Environment server that owns the attempt (a continued attempt must go back to it). */
  gym_instance_id: string | null;
  reward: number | null;
  mask_sample: boolean | null;
  /** Started from a restored boundary instead of from its input. */
  continued: boolean;
  reason?: string;
}

export interface Sibling {
  generation_index: number;
  rollout_id: string;
  attempts: Attempt[];
}

export interface PromptGroup {
  group_id: string;
  prompt_id: string;
  task_source: string;
  environment: string;
  recovery_granularity: RecoveryGranularity;
  restore_level: TargetLevel;
  expected_generations: number;
  target_step: number;
  status: GroupStatus;
  siblings: Sibling[];
  /** The sibling tasks to send, when not built from `task_ref` (small runs and tests). */
  tasks: unknown[];
  /** Where the group's tasks come from in the dataset (the sibling index is added per attempt). */
  task_ref?: Omit<TaskRef, 'sibling'>;
  /** Bumped when the whole cohort starts over, so a group-scored verifier sees a new cohort. */
  cohort_attempt?: number;
}

export interface Ledger {
  schema_version: number;
  run: string;
  /** Dataloader cursor: the next prompt group to reserve. */
  cursor: number;
  groups: Record<string, PromptGroup>;
  /** Group IDs in reservation order (deterministic iteration). */
  order: string[];
}

export class LedgerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LedgerError';
  }
}
