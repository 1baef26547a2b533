// `POST /v1/agent_sessions/close` (participants.md §3.2): stop the session's activation, return
// its observations and resources cookies, free it; the reply is kept for a retried close.
import { refuse } from '../../protocol/errors.js';
import { sameEpisode, type EpisodeId, type RolloutPath } from '../../protocol/ids.js';
import { cancelActivation } from './activate.js';
import type { AgentCore } from './core.js';
import { emptyObservations } from './reply.js';
import type { AgentSession } from './sessions.js';
import type { CloseReply, CloseRequest } from './wire.js';

function sameOwner(a: EpisodeId | null, b: EpisodeId | null): boolean {
  return a === null || b === null || sameEpisode(a, b);
}

/** A retried close gets the kept reply; another attempt's close of it is stale. */
function keptReply(core: AgentCore, key: string, episode: EpisodeId | null): CloseReply | undefined {
  const kept = core.sessions.receipt(key);
  if (!kept) return undefined;
  if (sameOwner(kept.episode, episode)) return kept.reply;
  throw refuse('stale_attempt', `agent session '${key}' was closed by attempt ${JSON.stringify(kept.episode)}`);
}

export async function closeSession(core: AgentCore, body: CloseRequest, prefix: RolloutPath | undefined): Promise<CloseReply> {
  const key = body.agent_session_id;
  const episode = body.episode_id ?? prefix?.episode ?? null;
  const kept = keptReply(core, key, episode);
  if (kept) return kept;
  core.assertNotRetired(episode);
  // A full participant checks admission before marking the session closing; a restart-only
  // agent's close_admission blocks only new seeds.
  if (core.checkpointing && core.mode === 'full' && !core.gate.isOpen) {
    await core.waitForResume();
    core.assertNotRetired(episode);
    const later = keptReply(core, key, episode);
    if (later) return later;
  }
  const s = core.sessions.get(key);
  if (!s) {
    // Closing an unknown ID fences a late seed of it (for the retry window).
    const reply: CloseReply = { agent_session_id: key, agent_observations: emptyObservations(), resources_cookies: null };
    core.sessions.keepReceipt(key, reply, episode);
    return reply;
  }
  if (!sameOwner(s.episode, episode)) {
    throw refuse('stale_attempt', `agent session '${key}' belongs to attempt ${JSON.stringify(s.episode)}`);
  }
  if (s.retiring) throw refuse('stale_attempt', `agent session '${key}' is being retired`);
  s.closeTask ??= runClose(core, s);
  return s.closeTask;
}

/** Exactly once per session: cancel a still-running activation, wait for it, then free. */
async function runClose(core: AgentCore, s: AgentSession): Promise<CloseReply> {
  s.closing = true;
  core.notify();
  try {
    const running = s.running;
    if (running) {
      cancelActivation(running, refuse('checkpoint_error', `activation ${running.index} of agent session '${s.key}' was cancelled by a close`));
      await running.stopped;
    }
    if (s.retiring) throw refuse('stale_attempt', `the close of agent session '${s.key}' was taken over by a retire`);
    return finishClose(core, s);
  } finally {
    s.closing = false;
    core.notify();
  }
}

/** Builds the receipt, keeps it for the retry window and frees the session. */
export function finishClose(core: AgentCore, s: AgentSession): CloseReply {
  const reply: CloseReply = {
    agent_session_id: s.key,
    agent_observations: s.observations ?? emptyObservations(),
    resources_cookies: s.resourcesCookies,
  };
  core.sessions.keepReceipt(s.key, reply, s.episode);
  core.sessions.remove(s);
  return reply;
}
