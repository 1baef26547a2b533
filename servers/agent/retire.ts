// Retire (participants.md §3.6, §3.8): stop each covered session's activation once, wait until
// it stopped, free the session, untrack it. Cut short by the deadline → the session stays tracked
// (retiring, so it blocks prepare) and a retried retire waits again without cancelling twice.
import { refuse } from '../../protocol/errors.js';
import { abortedSignal } from '../common/async.js';
import { captureKey, type EpisodeId } from '../../protocol/ids.js';
import { cancelActivation } from './activate.js';
import { finishClose } from './close.js';
import type { AgentCore } from './core.js';
import type { AgentSession } from './sessions.js';

export async function retireEpisodes(core: AgentCore, targets: readonly EpisodeId[], signal: AbortSignal): Promise<void> {
  const sessions = core.sessions.covered(targets);
  for (const s of sessions) s.retiring = true;
  core.notify();
  const reason = (e: EpisodeId | null) => refuse('stale_attempt', `attempt ${e ? captureKey(e) : '?'} was retired`);
  const aborted = abortedSignal(signal);
  aborted.catch(() => undefined);
  const restarts = core.inflight.cancelCovered(targets, reason(targets[0] ?? null));
  await Promise.race([Promise.all([restarts, ...sessions.map((s) => retireSession(core, s, reason(s.episode)))]), aborted]);
}

async function retireSession(core: AgentCore, s: AgentSession, reason: unknown): Promise<void> {
  const running = s.running;
  if (running) {
    // A parked activation wakes with this reason (its wait is cancelled) and ends with stale_attempt.
    cancelActivation(running, reason);
    await running.stopped;
  }
  // A close already under way sees `retiring` once the activation stopped and refuses itself.
  if (core.sessions.get(s.key) !== s) return;
  if (core.mode === 'restart_only') {
    // retire_agent_session's default for an agent without hooks: close the session.
    finishClose(core, s);
  } else {
    core.sessions.remove(s);
  }
  core.notify();
}
