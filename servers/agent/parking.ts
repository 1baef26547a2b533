// Boundaries and parking of a session's activation (participants.md §3.5).
import type { AgentCore } from './core.js';
import { pinBoundary, type LoopState } from './loop-state.js';
import type { AgentSession } from './sessions.js';

/** Records a boundary; parks there (state `at_boundary`) while a checkpoint is open. */
export async function recordBoundary(core: AgentCore, s: AgentSession, state: LoopState, signal: AbortSignal): Promise<void> {
  signal.throwIfAborted();
  s.boundary = pinBoundary(state);
  if (core.parkWanted(s)) {
    s.state = 'at_boundary';
    core.notify();
    await core.waitForResume(signal);
  }
  s.state = 'running';
}

/**
 * A model call made right after a boundary. While it is in flight the session counts as
 * `at_boundary` (the call is safe to repeat). A reply (or failure) that arrives while a checkpoint
 * is open is held and the session stays parked at the boundary before the call until resume, so
 * readiness never regresses between prepare and commit; after a crash the restored session
 * re-issues the call.
 */
export async function awaitingModel<T>(core: AgentCore, s: AgentSession, signal: AbortSignal, call: () => Promise<T>): Promise<T> {
  signal.throwIfAborted();
  s.state = 'at_boundary';
  core.notify();
  let outcome: { ok: true; value: T } | { ok: false; error: unknown };
  try {
    outcome = { ok: true, value: await call() };
  } catch (error) {
    if (signal.aborted) throw signal.reason;
    outcome = { ok: false, error };
  }
  if (core.parkWanted(s)) await core.waitForResume(signal);
  signal.throwIfAborted();
  s.state = 'running';
  if (!outcome.ok) throw outcome.error;
  return outcome.value;
}
