// How a checkpoint attempt's failures are classified for the pump (controller.md §2.8): a Gym that
// restarted under the controller, a participant that cannot be reached, a timeout, an I/O error,
// or a broken invariant.
import type { CheckpointReason } from '../protocol/controller.js';
import { describeFailure, failureType, unreachableServers } from './failures.js';
import type { ShardAnswer } from './messages.js';

/** The Gym restarted under the controller: the attempt ends, the run recovers. */
export class GymRestarted extends Error {}

/** A failure of this attempt, classified for the pump (controller.md §2.8). */
export class AttemptFailed extends Error {
  constructor(
    readonly reason: CheckpointReason,
    message: string,
    /** A participant could not be reached: Gym is down, not failing; the run waits for it. */
    readonly gymUnreachable = false,
  ) {
    super(message);
  }
}

/** Every shard answered without an error, or the attempt fails (a shard's part is missing from the cut). */
export function requireAnswers(what: string, answers: ShardAnswer[]): ShardAnswer[] {
  const failed = answers.filter((a) => a.error !== undefined);
  if (failed.length > 0)
    throw new AttemptFailed(
      'timeout',
      `${what}: ${failed
        .map((a) => `shard ${a.shard}: ${a.error}`)
        .join('; ')
        .slice(0, 500)}`,
    );
  return answers;
}

/**
 * Wraps exactly the Gym prepare and commit calls (review AI, controller.md §2.8): their failures
 * are retryable for the pump — a timeout keeps `timeout`, everything else is `io_error`.
 */
export async function gymCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const type = failureType(err);
    const message = describeFailure(err);
    if (type === 'invariant_error') throw err;
    const reason = type === 'gym_not_ready' || /timeout|deadline/i.test(type ?? '') ? 'timeout' : 'io_error';
    throw new AttemptFailed(reason, message, unreachableServers(err).length > 0);
  }
}

export function classify(err: unknown): CheckpointReason {
  return failureType(err) === 'invariant_error' ? 'invariant_error' : 'io_error';
}
