// The activity proxies of the workflows, with their timeouts and retry policies side by side.
import {
  ActivityCancellationType,
  ActivityFailure,
  TimeoutFailure,
  log,
  proxyActivities,
  proxyLocalActivities,
  type ActivityOptions,
} from '@temporalio/workflow';
import { TimeoutType } from '@temporalio/common';
import type { createActivities } from '../activities/index.js';
import { NON_RETRYABLE_ERROR_TYPES } from '../protocol/controller.js';

type ActivityFunctions = ReturnType<typeof createActivities>;
export type Activities = ReturnType<typeof proxyActivities<ActivityFunctions>>;

/** Where an activity runs and how long its task may wait for a worker before it is scheduled again. */
export interface ActivityPlacement {
  taskQueue?: string | undefined;
  /** `controller.schedule_to_start_timeout_s`. */
  scheduleToStartTimeoutS: number;
}

function isLostTask(err: unknown): boolean {
  return err instanceof ActivityFailure && err.cause instanceof TimeoutFailure && err.cause.timeoutType === TimeoutType.SCHEDULE_TO_START;
}

async function untilStarted<T>(name: string, call: () => Promise<T>): Promise<T> {
  for (let n = 1; ; n++) {
    try {
      return await call();
    } catch (err) {
      if (!isLostTask(err)) throw err;
      log.warn('an activity task was not taken by any worker in time; scheduling it again', { activity: name, times: n });
    }
  }
}

/**
 * Activities scheduled with a schedule-to-start timeout and scheduled again when it passes. A task
 * the server loses (a restart between its scheduling and a worker taking it: chaos seed 107,
 * temporalio/temporal#9118) has no other deadline: start-to-close and heartbeat timeouts begin only
 * once a worker has it, so the workflow would wait for it for ever. Every activity here is
 * idempotent (a `/run` of the same attempt attaches to the running episode).
 */
function proxy(placement: ActivityPlacement, options: Omit<ActivityOptions, 'taskQueue' | 'scheduleToStartTimeout'>): Activities {
  const acts = proxyActivities<ActivityFunctions>({
    ...options,
    ...(placement.taskQueue !== undefined ? { taskQueue: placement.taskQueue } : {}),
    scheduleToStartTimeout: `${placement.scheduleToStartTimeoutS} seconds`,
  });
  return new Proxy(acts, {
    get(target, name: string) {
      const fn = (target as Record<string, unknown>)[name] as ((...args: unknown[]) => Promise<unknown>) & {
        executeWithOptions: (o: unknown, a: unknown[]) => Promise<unknown>;
      };
      const wrapped = (...args: unknown[]): Promise<unknown> => untilStarted(name, () => fn(...args));
      wrapped.executeWithOptions = (o: unknown, a: unknown[]): Promise<unknown> => untilStarted(name, () => fn.executeWithOptions(o, a));
      return wrapped;
    },
  });
}

const nonRetryableErrorTypes = [...NON_RETRYABLE_ERROR_TYPES];

const controlRetry = { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 seconds', maximumAttempts: 4, nonRetryableErrorTypes };

/** Control calls: a few quick retries with the same ID and arguments; the pump owns new attempts. */
export function controlActivities(placement: ActivityPlacement): Activities {
  return proxy(placement, {
    startToCloseTimeout: '10 minutes',
    // Short: a worker that dies in the middle of a checkpoint is noticed within seconds.
    heartbeatTimeout: '15 seconds',
    retry: controlRetry,
  });
}

/**
 * A shard's batch of attempt starts (activities/attempt-starts.ts): retried until it goes through,
 * since the attempts are in the shard's ledger as dispatched already; each try restarts only what
 * had not started (a start of an ID that exists is refused, and counted as started).
 */
export function attemptStartActivities(placement: ActivityPlacement): Activities {
  return proxy(placement, {
    startToCloseTimeout: '5 minutes',
    // It beats after each start: a worker that dies in the middle of a batch is noticed in seconds.
    heartbeatTimeout: '15 seconds',
    retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 seconds', nonRetryableErrorTypes },
  });
}

/**
 * Discovery while the run waits for Gym to come back after a crash: retried with backoff for as
 * long as the run waits (`controller.gym_recovery_timeout_s`); each try shows in the UI as the
 * pending activity's attempt and last failure. Refusals (a deployment without a model…) end it.
 */
export function gymRecoveryActivities(placement: ActivityPlacement, timeoutS: number): Activities {
  return proxy(placement, {
    scheduleToCloseTimeout: `${timeoutS} seconds`,
    startToCloseTimeout: '1 minute',
    retry: { initialInterval: '1 second', backoffCoefficient: 1.5, maximumInterval: '10 seconds', nonRetryableErrorTypes },
  });
}

/**
 * One look at Gym (discovery) after live failures: a server that does not answer, or answers as a
 * new process, means the failures were a crash's. Not retried: an unreachable server is the answer.
 */
export function gymProbeActivities(placement: ActivityPlacement): Activities {
  return proxy(placement, {
    startToCloseTimeout: '30 seconds',
    retry: { maximumAttempts: 1 },
  });
}

const storageRetry = { initialInterval: '500 ms', maximumInterval: '10 seconds', maximumAttempts: 5, nonRetryableErrorTypes };

/** Snapshot file I/O and ledger bookkeeping: retried until they succeed or fail for good. */
export function storageActivities(placement: ActivityPlacement): Activities {
  return proxy(placement, {
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

/**
 * A checkpoint attempt's Gym calls (prepare, commit, resume) in the attempt's own worker: each as
 * a regular activity cost a server round trip and a workflow task of its own while admission was
 * closed; as local activities the attempt runs them back to back in one workflow task. Each is
 * idempotent by checkpoint ID, so a worker that dies in the middle of one (noticed by the workflow
 * task's timeout, as a local activity cannot heartbeat) has it run again from the retried task.
 * Retried like the other control calls.
 */
export function checkpointGymLocalActivities(): LocalActivities {
  return proxyLocalActivities<ActivityFunctions>({
    startToCloseTimeout: '10 minutes',
    retry: controlRetry,
  });
}

/**
 * A checkpoint attempt's look at Gym (its restart check), in the workflow's own worker, within the
 * attempt's prepare budget: each server's status is waited for `prepareTimeoutS` (a refused
 * connection is tried again inside), and the look is not retried. A server that does not answer
 * in time (stopped, hung) fails the attempt, which aborts and reopens admission; otherwise it held
 * admission closed for minutes.
 */
export function checkpointProbeLocalActivities(prepareTimeoutS: number): LocalActivities {
  return proxyLocalActivities<ActivityFunctions>({
    startToCloseTimeout: `${prepareTimeoutS + 10} seconds`,
    retry: { maximumAttempts: 1 },
  });
}

/**
 * A checkpoint attempt's signals to its run's shards (activities/shard-signals.ts), in the
 * workflow's own worker: each signal is tried a few times inside, so the activity is not retried
 * (a shard not reached is in its outcome).
 */
export function shardSignalLocalActivities(): LocalActivities {
  return proxyLocalActivities<ActivityFunctions>({
    startToCloseTimeout: '1 minute',
    retry: { maximumAttempts: 1 },
  });
}

/** One long `/run`: hours at most, a heartbeat to notice a dead worker, unlimited transient retries. */
export function runActivities(placement: ActivityPlacement, heartbeatTimeoutS: number): Activities {
  return proxy(placement, {
    // Explicit: with the option unset, SDK 1.24 sends no cancellation type and core applies
    // TRY_CANCEL (proto default 0), despite the documented default. A rollout deadline must see
    // the `/run` actually ended before it reports (controller.md §6, C6).
    cancellationType: ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    startToCloseTimeout: '24 hours',
    // Each heartbeat that reaches the server is a write of the rollout's state, sent every 0.8 ×
    // this: thousands of parked rollouts heartbeat at once. It only notices a dead worker; a
    // deadline ends the `/run` through the retire, not through a heartbeat reply.
    heartbeatTimeout: `${heartbeatTimeoutS} seconds`,
    // No list of non-retryable types: `/run` marks each of its failures retryable or not itself
    // (activities/rollouts.ts), and a list is copied into the state of every parked attempt's
    // activity, in the worker's heap and in the server, thousands at once (docs/performance.md).
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });
}
