// The controller's Temporal activities (docs/controller.md "Activities"): the only I/O of the
// controller. Workflows use `proxyActivities<Activities>()`; every input and output is plain JSON.
import type { ActivityLog } from './activity-context.js';
import { closeControlPool } from './control-client.js';
import { createControllerFileActivities } from './controller-files.js';
import { createGymActivities } from './gym.js';
import { createLoaderActivities } from './loader.js';
import { createMetricsActivities } from './metrics.js';
import { closeRunPool, createRolloutActivities } from './rollouts.js';
import { createSnapshotActivities } from './snapshots.js';
import { createTrainerActivities, type TrainerDeps } from './trainer.js';

export interface ActivityDeps {
  /** Bearer token of the Gym control routes. */
  controlToken: string;
  /** Where logged-not-raised failures go (restore cleanup); default the activity logger. */
  log?: ActivityLog;
  trainer?: TrainerDeps;
}

export function createActivities(deps: ActivityDeps) {
  return {
    ...createGymActivities(deps),
    ...createRolloutActivities(),
    ...createSnapshotActivities(),
    ...createControllerFileActivities(),
    ...createMetricsActivities(),
    ...createLoaderActivities(),
    ...createTrainerActivities({ ...(deps.log ? { log: deps.log } : {}), ...deps.trainer }),
  };
}

export type Activities = ReturnType<typeof createActivities>;

/** Closes the control and `/run` connection pools (worker shutdown, tests). */
export async function closeActivityPools(): Promise<void> {
  await Promise.all([closeControlPool(), closeRunPool()]);
}

export type { ActivityLog } from './activity-context.js';
export type {
  DiscoverGymInput,
  GymCallInput,
  GymCommitInput,
  GymForgetInput,
  GymForgetOutcome,
  GymRenewOutcome,
  GymRestoreInput,
  GymResumeOutcome,
  GymRetireInput,
  GymRetireOutcome,
} from './gym.js';
export type { LoadPromptGroupsInput, LoadedPromptGroup, LoadedPromptGroups } from './loader.js';
export type { LatestSnapshot, SkippedSnapshot } from './snapshots.js';
