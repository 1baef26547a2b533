// What every controller activity shares: the Temporal activity context (optional, so the same
// functions run in plain unit tests), a heartbeat loop around long calls, and the typed failures
// workflows branch on (protocol/controller.ts FAILURE_TYPES).
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { FAILURE_TYPES } from '../protocol/controller.js';

/** Structured log sink (message, fields). */
export type ActivityLog = (message: string, fields: Record<string, unknown>) => void;

/** Shortest heartbeat period while an activity waits on I/O: cancellation reaches an activity only through heartbeats. */
export const HEARTBEAT_INTERVAL_MS = 5_000;

/** The current activity context, or undefined outside one (plain unit tests). */
export function activityContext(): Context | undefined {
  try {
    return Context.current();
  } catch {
    return undefined;
  }
}

/** `deps.log` if given, else the activity logger, else console. */
export function logger(log: ActivityLog | undefined): ActivityLog {
  if (log) return log;
  return (message, fields) => {
    const ctx = activityContext();
    if (ctx) ctx.log.warn(message, fields);
    else console.warn(`[activities] ${message}`, JSON.stringify(fields));
  };
}

/**
 * Runs `fn` with the activity's cancellation signal while heartbeating every `intervalMs`.
 * If the activity was cancelled, whatever `fn` threw is replaced by the cancellation itself, so
 * the worker reports the activity as cancelled rather than failed.
 */
export async function heartbeating<T>(details: unknown, fn: (signal: AbortSignal | undefined) => Promise<T>, intervalMs?: number): Promise<T> {
  const ctx = activityContext();
  if (!ctx) return fn(undefined);
  // A local activity cannot heartbeat (its workflow task's timeout watches the worker instead);
  // it still gets cancellation through the signal.
  if (ctx.info.isLocal) return runCancellable(ctx, fn);
  // The first beat waits one interval: the SDK sends a first heartbeat at once and throttles the
  // rest, so beating at the start cost a server write per call that finishes within seconds (every
  // control call, every short rollout) and pushed the next beat, the one that can carry a
  // cancellation, out to the throttle interval.
  const timer = setInterval(() => ctx.heartbeat(details), intervalMs ?? beatEvery(ctx.info.heartbeatTimeoutMs));
  try {
    return await runCancellable(ctx, fn);
  } finally {
    clearInterval(timer);
  }
}

/**
 * The SDK sends at most one heartbeat per 0.8 × the heartbeat timeout, so a beat every quarter of
 * the timeout keeps each window covered; beating more often only costs the main thread (thousands
 * of parked `/run`s, each with a long timeout, all beat on it).
 */
export function beatEvery(heartbeatTimeoutMs: number | undefined): number {
  if (!heartbeatTimeoutMs) return HEARTBEAT_INTERVAL_MS;
  return Math.min(Math.max(HEARTBEAT_INTERVAL_MS, heartbeatTimeoutMs / 4), heartbeatTimeoutMs / 2);
}

async function runCancellable<T>(ctx: Context, fn: (signal: AbortSignal | undefined) => Promise<T>): Promise<T> {
  try {
    return await fn(ctx.cancellationSignal);
  } catch (err) {
    rethrowIfCancelled(ctx.cancellationSignal, err);
    throw err;
  }
}

/** Throws the cancellation (a CancelledFailure from the worker) when `signal` aborted. */
export function rethrowIfCancelled(signal: AbortSignal | undefined, err?: unknown): void {
  if (signal?.aborted) throw (signal.reason as unknown) ?? err;
}

const MAX_MESSAGE = 2_000;
const MAX_DETAIL = 300;

export function clip(s: string, max: number = MAX_DETAIL): string {
  return s.length > max ? `${s.slice(0, max)}…` : s;
}

/** Controller invariant violated (bad snapshot, protocol violation): never retried, ends the run. */
export function invariantFailure(message: string, details?: Record<string, unknown>): ApplicationFailure {
  return ApplicationFailure.nonRetryable(clip(message, MAX_MESSAGE), FAILURE_TYPES.invariant, ...(details ? [details] : []));
}

/** A filesystem failure that a retry may fix. */
export function storageFailure(context: string, err: unknown): ApplicationFailure {
  const e = err as NodeJS.ErrnoException | undefined;
  const what = e?.code ? `${e.code}: ${e.message}` : (e?.message ?? String(err));
  return ApplicationFailure.retryable(clip(`${context}: ${what}`, MAX_MESSAGE), FAILURE_TYPES.storage, {
    ...(e?.code ? { code: e.code } : {}),
  });
}

/** Runs `fn`: ApplicationFailures pass through; anything else is a retryable storage failure. */
export async function withStorageFailure<T>(context: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ApplicationFailure) throw err;
    throw storageFailure(context, err);
  }
}

export function clipMessage(s: string): string {
  return clip(s, MAX_MESSAGE);
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Positive finite seconds, or an invariant failure naming the field. */
export function checkSeconds(name: string, v: unknown): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw invariantFailure(`${name} must be a positive number of seconds (got ${String(v)})`);
  return v;
}
