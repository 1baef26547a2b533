// The agent's checkpoint records (`AgentSessionRecord`, participants.md §3.6; control-plane.md §10):
// `{episode_id, session_key, session, boundary, episode}`, built at export, checked and turned back
// into sessions at restore.
import { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { EpisodeIdSchema, captureKey, nextAttempt, type EpisodeId } from '../../protocol/ids.js';
import { type JsonText, jsonTextOnce } from '../../protocol/json-text.js';
import { LosslessJsonError, stringifyLossless, toPlainJson } from '../../protocol/lossless-json.js';
import type { CheckpointRecord } from '../../protocol/manifest.js';
import { LoopStateSchema, pinBoundary, type BoundarySnapshot, type LoopState } from './loop-state.js';
import { isPlainAgentRecord } from './record-shape.js';
import { grantOf } from './seed.js';
import { newSession, type AgentSession } from './sessions.js';
import { SeedRequestSchema, type CompletedReply, type Observations } from './wire.js';

/** `export_agent_sessions` of Simple Agent: the session as JSON. */
export function sessionJson(s: AgentSession): Record<string, unknown> {
  return {
    request: s.request,
    resources_cookies: s.resourcesCookies,
    observations: s.observations,
    activations: s.activations,
    completed_activation: s.completedActivation,
    completed_reply: s.completedReply,
  };
}

/**
 * `pinned`: the boundary the session was at when the export chose it (the record may be built later).
 * The boundary and the seed request, the bulk of a record, go in as JSON text made once each
 * (`jsonTextOnce`; a pinned boundary and a seed request are never mutated, a new one replaces
 * them): a session parked across several checkpoints is not serialized again while admission
 * is closed.
 */
export function sessionRecord(s: AgentSession, pinned: BoundarySnapshot | null = s.boundary): CheckpointRecord {
  try {
    const texts = recordTexts(s, pinned);
    const session = { ...sessionJson(s), request: texts.request };
    return { episode_id: s.episode!, session_key: s.key, session, boundary: texts.boundary, episode: null };
  } catch (err) {
    if (!(err instanceof LosslessJsonError)) throw err;
    throw refuse('invalid_checkpoint_state', `the record of episode ${s.episode ? captureKey(s.episode) : s.key} cannot be serialized: ${err.message}`);
  }
}

/**
 * The bulk of a session's record: its pinned boundary and its seed request as JSON text, each made
 * once (the export's, or made ahead of it by `stageAhead`). Throws `LosslessJsonError`.
 */
export function recordTexts(s: AgentSession, pinned: BoundarySnapshot | null): { boundary: JsonText | null; request: JsonText } {
  return {
    boundary: pinned ? jsonTextOnce(pinned, () => stringifyLossless(pinned())) : null,
    request: jsonTextOnce(s.request, () => stringifyLossless(s.request)),
  };
}

const SessionJsonSchema = z.looseObject({
  request: SeedRequestSchema,
  // `null` must round-trip as null (a session without a direct HTTP grant).
  resources_cookies: z.record(z.string(), z.string()).nullable(),
  observations: z
    .looseObject({ source: z.string(), records: z.array(z.unknown()), gaps: z.array(z.unknown()) })
    .nullable()
    .default(null),
  activations: z.number().int().min(0),
  completed_activation: z.number().int().min(0),
  completed_reply: z.looseObject({ response: z.record(z.string(), z.unknown()), cookies: z.record(z.string(), z.string()) }).nullable(),
});

export const AgentRecordSchema = z.looseObject({
  episode_id: EpisodeIdSchema,
  session_key: z.string().min(1),
  session: SessionJsonSchema,
  boundary: LoopStateSchema.nullable(),
  // A legacy `/run` episode's own boundary: Simple Agent's legacy `/run` is not served here.
  episode: z.null().default(null),
});
export type AgentRecord = z.infer<typeof AgentRecordSchema>;

/** Records already checked by `parseRecord` (validation at read, then install: parsed once). */
const parsed = new WeakMap<CheckpointRecord, AgentRecord>();

/** Parses one record; a throw names what is wrong (the plane adds the episode). */
export function parseRecord(record: CheckpointRecord): AgentRecord {
  const known = parsed.get(record);
  if (known) return known;
  const plain = toPlainJson(record);
  let data: AgentRecord;
  if (isPlainAgentRecord(plain)) data = plain as AgentRecord;
  else {
    const r = AgentRecordSchema.safeParse(plain);
    if (!r.success) {
      const issue = r.error.issues[0]!;
      throw new Error(`${issue.path.join('.') || 'record'}: ${issue.message}`);
    }
    data = r.data;
  }
  if (data.session.completed_activation > data.session.activations) {
    throw new Error('session.completed_activation is larger than session.activations');
  }
  grantOf(data.session.request);
  parsed.set(record, data);
  return data;
}

/** The session a replacement attempt continues (restore_agent_sessions + registration). */
export function restoredSession(r: AgentRecord): AgentSession {
  const replacement: EpisodeId = nextAttempt(r.episode_id);
  const request = { ...r.session.request, episode_id: replacement };
  const s = newSession({ key: r.session_key, episode: replacement, request, grant: grantOf(request) });
  s.resourcesCookies = r.session.resources_cookies;
  s.observations = r.session.observations as Observations | null;
  s.activations = r.session.activations;
  s.completedActivation = r.session.completed_activation;
  s.completedReply = r.session.completed_reply as CompletedReply | null;
  if (r.boundary) {
    const continuation = r.boundary as LoopState;
    s.continuation = continuation;
    // Exported again as is if a checkpoint comes before the replacement claims it. Not copied:
    // nothing mutates a restored continuation (activation starts from a deep copy of it).
    s.boundary = pinBoundary(continuation);
  }
  s.restoredPending = true;
  return s;
}
