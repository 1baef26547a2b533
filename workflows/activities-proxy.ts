// The activity proxies of the workflows, with their timeouts and retry policies side by side.
import { ActivityCancellationType, proxyActivities, proxyLocalActivities } from '@temporalio/workflow';
import type { createActivities } from '../activities/index.js';
import { NON_RETRYABLE_ERROR_TYPES } from '../protocol/controller.js';

type ActivityFunctions = ReturnType<typeof createActivities>;
export type Activities = ReturnType<typeof proxyActivities<ActivityFunctions>>;

const nonRetryableErrorTypes = [...NON_RETRYABLE_ERROR_TYPES];

const controlRetry = { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 seconds', maximumAttempts: 4, nonRetryableErrorTypes };

/** Control calls: a few quick retries with the same ID and arguments; the pump owns new attempts. */
export function controlActivities(taskQueue?: string): Activities {
  return proxyActivities<ActivityFunctions>({
    taskQueue,
    startToCloseTimeout: '10 minutes',
    // Short: a worker that dies in the middle of a checkpoint is noticed within seconds.
    heartbeatTimeout: '15 seconds',
    retry: controlRetry,
  });
}

/**
 * Discovery while the run waits for Gym to come back after a crash: retried with backoff for as
 * long as the run waits (`controller.gym_recovery_timeout_s`); each try shows in the UI as the
 * pending activity's attempt and last failure. Refusals (a deployment without a model…) end it.
 */
export function gymRecoveryActivities(taskQueue: string | undefined, timeoutS: number): Activities {
  return proxyActivities<ActivityFunctions>({
    taskQueue,
    scheduleToCloseTimeout: `${timeoutS} seconds`,
    startToCloseTimeout: '1 minute',
    retry: { initialInterval: '1 second', backoffCoefficient: 1.5, maximumInterval: '10 seconds', nonRetryableErrorTypes },
  });
}

const storageRetry = { initialInterval: '500 ms', maximumInterval: '10 seconds', maximumAttempts: 5, nonRetryableErrorTypes };

/** Snapshot file I/O and ledger bookkeeping: retried until they succeed or fail for good. */
export function storageActivities(taskQueue?: string): Activities {
  return proxyActivities<ActivityFunctions>({
    taskQueue,
    startToCloseTimeout: '10 minutes',
    // Long ones heartbeat; this bounds how long an activity on a dead worker goes unnoticed.
    heartbeatTimeout: '20 seconds',
    retry: storageRetry,
  });
}

export type LocalActivities = ReturnType<typeof proxyLocalActivities<ActivityFunctions>>;

/**
 * Short snapshot file I/O on the checkpoint path (the ledger cut, allocation, publication): run in
 * the workflow's own worker, so neither a server round trip nor the (large) input lands in the
 * history while admission is closed. Retried like storage. A local activity cannot heartbeat: the
 * workflow task's own timeout notices a dead worker, and a replay runs the activity again (each is
 * idempotent).
 */
export function storageLocalActivities(): LocalActivities {
  return proxyLocalActivities<ActivityFunctions>({
    startToCloseTimeout: '10 minutes',
    retry: storageRetry,
  });
}

/** Quick control reads in the workflow's own worker (the Gym's endpoints files), retried like control calls. */
export function controlLocalActivities(): LocalActivities {
  return proxyLocalActivities<ActivityFunctions>({
    startToCloseTimeout: '1 minute',
    retry: controlRetry,
  });
}

/** One long `/run`: hours at most, a heartbeat to notice a dead worker, unlimited transient retries. */
export function runActivities(taskQueue: string | undefined, heartbeatTimeoutS: number): Activities {
  return proxyActivities<ActivityFunctions>({
    taskQueue,
    // Explicit: with the option unset, SDK 1.24 sends no cancellation type and core applies
    // TRY_CANCEL (proto default 0), despite the documented default. A rollout deadline must see
    // the `/run` actually ended before it reports (controller.md §6, C6).
    cancellationType: ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    startToCloseTimeout: '24 hours',
    // Each heartbeat that reaches the server is a write of the rollout's state, sent every 0.8 ×
    // this: thousands of parked rollouts heartbeat at once. It only notices a dead worker; a
    // deadline ends the `/run` through the retire, not through a heartbeat reply.
    heartbeatTimeout: `${heartbeatTimeoutS} seconds`,
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds', nonRetryableErrorTypes },
  });
}
