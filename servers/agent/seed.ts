// `POST /v1/agent_sessions` (participants.md §3.2): seed an agent session, idempotent per
// `agent_session_id`. While a checkpoint is open a seed waits for resume (it is not refused).
import { refuse } from '../../protocol/errors.js';
import { sameEpisode, type EpisodeId, type RolloutPath } from '../../protocol/ids.js';
import type { AgentCore } from './core.js';
import { newSession, type AgentSession } from './sessions.js';
import { canonicalJson } from '../../protocol/canonical-json.js';
import type { DirectHttpGrant, SeedRequest } from './wire.js';

export interface SeedOutcome {
  reply: { agent_session_id: string };
  session: AgentSession;
}

/** Simple Agent accepts at most one direct HTTP grant, no required other grant, unique names. */
export function grantOf(req: SeedRequest): DirectHttpGrant | null {
  const names = new Set<string>();
  let direct: DirectHttpGrant | null = null;
  for (const g of req.tool_accesses) {
    if (names.has(g.name)) throw refuse('invalid_request', `tool access name '${g.name}' is not unique`);
    names.add(g.name);
    if (g.kind === 'direct_http') {
      if (direct) throw refuse('invalid_request', 'Simple Agent accepts at most one direct_http tool access');
      direct = g as DirectHttpGrant;
    } else if (g.required) {
      throw refuse('invalid_request', `Simple Agent cannot use the required ${g.kind} tool access '${g.name}'`);
    }
  }
  return direct;
}

export function seedEpisode(core: AgentCore, body: SeedRequest, prefix: RolloutPath | undefined): EpisodeId | null {
  if (prefix && !prefix.episode && core.checkpointing) throw refuse('invalid_rollout_id', `cannot decode the capture key '${prefix.key}'`);
  const fromPrefix = prefix?.episode;
  if (body.episode_id && fromPrefix && !sameEpisode(body.episode_id, fromPrefix)) {
    throw refuse('invalid_request', `episode_id ${JSON.stringify(body.episode_id)} does not match the prefix '${prefix!.key}'`);
  }
  const episode = body.episode_id ?? fromPrefix ?? null;
  if (core.checkpointing && !episode)
    throw refuse('rollout_id_required', 'a seed needs an episode_id (or a /ng-rollout/<capture key> prefix) while checkpointing is on');
  return episode;
}

export async function seedSession(core: AgentCore, body: SeedRequest, prefix: RolloutPath | undefined): Promise<SeedOutcome> {
  const episode = seedEpisode(core, body, prefix);
  core.assertNotRetired(episode);
  if (core.checkpointing && !core.gate.isOpen) {
    await core.waitForResume();
    core.assertNotRetired(episode);
  }
  // From here to registration nothing awaits: a seed is never "in progress" across an event-loop
  // turn, so it can neither block prepare nor race a restore or a retire (§3.2).
  const grant = grantOf(body);
  const request: SeedRequest = { ...body, episode_id: episode };
  const key = body.agent_session_id;
  if (core.sessions.receipt(key)) throw refuse('checkpoint_error', `agent session '${key}' is closed`);
  const existing = core.sessions.get(key);
  if (existing) {
    if (existing.retiring) throw refuse('stale_attempt', `agent session '${key}' is being retired`);
    if (existing.episode && episode && !sameEpisode(existing.episode, episode)) {
      throw refuse('stale_attempt', `agent session '${key}' belongs to attempt ${JSON.stringify(existing.episode)}`);
    }
    if (canonicalJson(existing.request) === canonicalJson(request)) return { reply: { agent_session_id: key }, session: existing };
    if (existing.restoredPending && existing.activations === 0) {
      // The replacement re-ran its seed stage (fresh resources cookies, its own prefix in the
      // grant's base URL): it takes over the restored session.
      existing.request = request;
      existing.grant = grant;
      existing.resourcesCookies = grant ? { ...grant.cookies } : null;
      existing.restoredPending = false;
      return { reply: { agent_session_id: key }, session: existing };
    }
    throw refuse('checkpoint_error', `agent session '${key}' was seeded with a different request`);
  }
  const session = newSession({ key, episode, request, grant });
  core.sessions.add(session);
  core.notify();
  return { reply: { agent_session_id: key }, session };
}
