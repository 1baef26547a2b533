// Reading the failures workflows receive from activities: the ApplicationFailure's type (what the
// workflows branch on), its message, and the Gym servers it could not reach.
import { ActivityFailure, ApplicationFailure } from '@temporalio/workflow';

function causeOf(err: unknown): unknown {
  return err instanceof ActivityFailure && err.cause ? err.cause : err;
}

/** The ApplicationFailure type behind an activity failure (a protocol code, `gym_transient`, …). */
export function failureType(err: unknown): string | undefined {
  const cause = causeOf(err);
  return cause instanceof ApplicationFailure ? (cause.type ?? undefined) : undefined;
}

/** The message of what failed (the activity's own failure, not the wrapper's). */
export function describeFailure(err: unknown): string {
  const cause = causeOf(err);
  return cause instanceof Error ? cause.message : String(cause);
}

/** The servers a Gym activity failure could not reach (GymFailureDetails.unreachable): Gym is down, not failing. */
export function unreachableServers(err: unknown): string[] {
  return detailList(err, 'unreachable');
}

/** Of those, the servers where nothing listens (GymFailureDetails.refused): their processes are gone, not busy. */
export function refusedServers(err: unknown): string[] {
  return detailList(err, 'refused');
}

function detailList(err: unknown, key: 'unreachable' | 'refused'): string[] {
  const cause = causeOf(err);
  const details = cause instanceof ApplicationFailure ? (cause.details?.[0] as Record<string, unknown> | undefined) : undefined;
  const list = details?.[key];
  return Array.isArray(list) ? (list as string[]) : [];
}
