// The controller's Temporal activities (docs/controller.md "Activities"): the only I/O of the
// controller. Workflows use `proxyActivities<Activities>()`; every input and output is plain JSON.
import type { Agent } from 'undici';
import type { ActivityLog } from './activity-context.js';
import type { RunKeeper } from './run-keeper.js';
import { createAttemptStartActivities } from './attempt-starts.js';
import { createControlPool, type ControlPoolOptions } from './control-client.js';
import { createControllerFileActivities } from './controller-files.js';
import { createGymActivities } from './gym.js';
import { createLoaderActivities } from './loader.js';
import { createMetricsActivities } from './metrics.js';
import { createRolloutActivities, createRunPool } from './rollouts.js';
import { createShardSignalActivities } from './shard-signals.js';
import { createSnapshotActivities } from './snapshots.js';
import { createTrainerActivities, type TrainerDeps } from './trainer.js';

/** The HTTP connection pools of the activities: control calls never wait behind parked `/run` calls. */
export interface ActivityPools {
  control: Agent;
  run: Agent;
}

export function createActivityPools(control: ControlPoolOptions = {}): ActivityPools {
  return { control: createControlPool(control), run: createRunPool() };
}

/** Closes the pools (worker shutdown, tests): in-flight calls finish first. */
export async function closeActivityPools(pools: ActivityPools): Promise<void> {
  await Promise.all([pools.control.close(), pools.run.close()]);
}

export interface ActivityDeps {
  /** Bearer token of the Gym control routes. */
  controlToken: string;
  pools: ActivityPools;
  /** Where logged-not-raised failures go (restore cleanup); default the activity logger. */
  log?: ActivityLog;
  trainer?: TrainerDeps;
  /** The worker's keeper of `/run`s (run-keeper.ts: paced heartbeats and outcomes); none: the SDK heartbeats and completes each. */
  runKeeper?: RunKeeper;
}

export function createActivities(deps: ActivityDeps) {
  return {
    ...createGymActivities({ controlToken: deps.controlToken, controlPool: deps.pools.control, ...(deps.log ? { log: deps.log } : {}) }),
    ...createRolloutActivities(deps.pools.run, deps.runKeeper),
    ...createSnapshotActivities(),
    ...createControllerFileActivities(),
    ...createMetricsActivities(),
    ...createLoaderActivities(),
    ...createAttemptStartActivities(),
    ...createShardSignalActivities(),
    ...createTrainerActivities({ ...(deps.log ? { log: deps.log } : {}), ...deps.trainer }),
  };
}

export type Activities = ReturnType<typeof createActivities>;

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
export type { AttemptStart, StartRolloutAttemptsInput, StartRolloutAttemptsOutcome } from './attempt-starts.js';
export type { SignalShardsInput, SignalShardsOutcome } from './shard-signals.js';
export type { LoadPromptGroupsInput, LoadedPromptGroup, LoadedPromptGroups } from './loader.js';
export type { LatestSnapshot, SkippedSnapshot } from './snapshots.js';
