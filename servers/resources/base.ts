// The one base every resources server is built on (participants.md §4): the checkpoint options
// (`checkpoint_mode`, `checkpoint_verify`), signed cookie sessions, and — with checkpointing on —
// the resources participant wired into the request lifecycle through Fastify hooks, so a server
// only registers its routes (`/seed_session`, tools, `/verify`, `/close_session`).
//
// Mode and verify are options of each server entry. A server module declares its own defaults
// (weather: stateless + replay), and the YAML may override them: a restart-only weather server is
// `{ kind: resources, type: weather, options: { checkpoint_mode: restart_only } }`.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { createGymApp, rolloutOf } from '../common/app.js';
import { ConfigError } from '../common/config-error.js';
import { mountParticipant, type ServerContext } from '../common/server-context.js';
import { parseCookieHeader, SESSION_COOKIE, setCookieValue, signSession, verifySession } from '../common/session-cookie.js';
import {
  CHECKPOINT_MODES,
  CHECKPOINT_VERIFIES,
  ResourcesParticipant,
  SEED_PATH,
  type CheckpointMode,
  type CheckpointVerify,
  type GroupScoring,
  type RequestTicket,
  type SessionStateHooks,
} from './participant.js';

export { CHECKPOINT_MODES, CHECKPOINT_VERIFIES, ResourcesParticipant } from './participant.js';
export type { CheckpointMode, CheckpointVerify, SessionStateHooks } from './participant.js';

/** The session ID key inside the signed `session` cookie. */
export const SESSION_ID_KEY = 'session_id';
export const CLOSE_FOLLOWS_HEADER = 'x-ng-checkpoint-close-follows';

export interface ResourcesCheckpointOptions {
  checkpoint_mode: CheckpointMode;
  checkpoint_verify: CheckpointVerify;
}

/**
 * The two checkpoint attributes as zod fields for a server's strict options schema, with that
 * server's declared defaults. Unknown values fail startup naming `servers.<name>.options.<key>`.
 */
export function checkpointOptionFields(defaults: { mode?: CheckpointMode; verify?: CheckpointVerify } = {}) {
  return {
    checkpoint_mode: z.enum(CHECKPOINT_MODES).default(defaults.mode ?? 'restart_only'),
    checkpoint_verify: z.enum(CHECKPOINT_VERIFIES).default(defaults.verify ?? 'wait'),
  };
}

/** How route handlers learn the session of their request. */
export interface SessionIds {
  /** The cookie's session ID (minted on first contact), or the ID a seed named. */
  of(req: FastifyRequest): string;
}

export interface ResourcesServerDefinition {
  /** Registers the server's data routes on the app. */
  routes(app: FastifyInstance, sessions: SessionIds): void | Promise<void>;
  /** Required for `checkpoint_mode: exported`. */
  sessionHooks?: SessionStateHooks;
  /** Group-scored verification: the cohort size and collection deadline discovery reports. */
  groupScored?: GroupScoring;
}

interface RequestState {
  sessionId: string;
  /** The reply must (re)issue the cookie: minted here, or replaced by a seed. */
  setCookie: boolean;
  seed: boolean;
  ticket?: RequestTicket;
}

const participants = new WeakMap<FastifyInstance, ResourcesParticipant>();

/** The participant of a resources app (undefined with checkpointing off); for tests and tooling. */
export function resourcesParticipantOf(app: FastifyInstance): ResourcesParticipant | undefined {
  return participants.get(app);
}

/** Builds a resources server app: session cookies always, the participant when checkpointing is on. */
export async function buildResourcesServer(
  ctx: ServerContext,
  checkpoint: ResourcesCheckpointOptions,
  def: ResourcesServerDefinition,
): Promise<FastifyInstance> {
  if (checkpoint.checkpoint_mode === 'exported' && !def.sessionHooks) {
    throw new ConfigError(
      `servers.${ctx.name}.options.checkpoint_mode`,
      "'exported' needs a server that implements the session hooks (export, restore, retire); this one does not",
    );
  }
  const app = createGymApp({ name: ctx.name, kind: 'resources', logLevel: ctx.logLevel });
  const participant = ctx.checkpoint.enabled
    ? new ResourcesParticipant({
        mode: checkpoint.checkpoint_mode,
        verify: checkpoint.checkpoint_verify,
        stateHooks: def.sessionHooks,
        ...(def.groupScored ? { groupScored: def.groupScored } : {}),
        log: (msg, detail) => app.log.warn({ detail }, msg),
      })
    : undefined;
  const states = new WeakMap<FastifyRequest, RequestState>();

  const sessionOf = (req: FastifyRequest, path: string): RequestState => {
    const data = verifySession(ctx.sessionSecret, parseCookieHeader(req.headers.cookie)[SESSION_COOKIE]);
    const fromCookie = data?.[SESSION_ID_KEY];
    let sessionId = typeof fromCookie === 'string' && fromCookie ? fromCookie : undefined;
    let setCookie = false;
    if (!sessionId) {
      sessionId = randomUUID();
      setCookie = true;
    }
    // A native seed names its session; from now on the caller's cookie carries that ID.
    if (path === SEED_PATH) {
      const named = (req.body as { resources_session_id?: unknown } | undefined)?.resources_session_id;
      if (typeof named === 'string' && named && named !== sessionId) {
        sessionId = named;
        setCookie = true;
      }
    }
    return { sessionId, setCookie, seed: path === SEED_PATH };
  };

  // §4.3 steps 1–6, for every data-plane request that is not GET/HEAD nor a control route.
  app.addHook('preHandler', async (req, reply) => {
    if (req.method === 'GET' || req.method === 'HEAD') return;
    const path = pathOf(req);
    if (path.startsWith('/ng-control/')) return;
    const st = sessionOf(req, path);
    states.set(req, st);
    if (!participant) return;
    const rollout = rolloutOf(req);
    if (rollout && !rollout.episode) throw refuse('invalid_rollout_id', `cannot decode the capture key '${rollout.key}'`);
    const ticket = participant.ticket(path, st.sessionId, rollout?.episode);
    st.ticket = ticket;
    const gone = new AbortController();
    // 'close' fires after the reply is sent and also when the client drops the connection (where
    // 'finish' and onResponse never come), so the counters cannot leak either way.
    reply.raw.once('close', () => {
      gone.abort(refuse('checkpoint_error', 'the client closed the connection'));
      participant.release(ticket);
    });
    await participant.admit(ticket, gone.signal);
  });

  // §4.3 steps 7–8, at the start of the reply: cookie, seed headers, session bind/end.
  app.addHook('onSend', async (req, reply, payload) => {
    const st = states.get(req);
    if (!st) return payload;
    // Seed replies always carry the cookie: the caller hands it to the agent as the tool grant.
    if (st.setCookie || st.seed) reply.header('set-cookie', setCookieValue(SESSION_COOKIE, signSession(ctx.sessionSecret, { [SESSION_ID_KEY]: st.sessionId })));
    const t = st.ticket;
    if (participant && t && reply.statusCode >= 200 && reply.statusCode < 300) {
      if (t.path === SEED_PATH) for (const [k, v] of Object.entries(participant.seedHeaders())) reply.header(k, v);
      participant.completed(t, req.headers[CLOSE_FOLLOWS_HEADER] === '1');
    }
    return payload;
  });

  const sessions: SessionIds = {
    of(req) {
      const st = states.get(req);
      if (!st) throw new Error('session requested outside a resources data-plane request');
      return st.sessionId;
    },
  };
  await def.routes(app, sessions);

  if (participant) {
    const plane = await mountParticipant(app, ctx, participant);
    if (plane) participant.attach(plane);
    participants.set(app, participant);
  }
  return app;
}

function pathOf(req: FastifyRequest): string {
  const q = req.url.indexOf('?');
  return q < 0 ? req.url : req.url.slice(0, q);
}

/** The reply to `/seed_session`: native callers named a session (§4.1), legacy rows get `{}`. */
export function seedReply(body: unknown, sessionId: string): Record<string, unknown> {
  const named = (body as { resources_session_id?: unknown } | undefined)?.resources_session_id;
  if (typeof named !== 'string' || !named) return {};
  return { resources_session_id: sessionId, resources_tools: null, sandbox_access: null };
}

/** A task field of a verify body: top level (task_data merged in by the environment) or under `task_data`. */
export function taskField(body: unknown, key: string): unknown {
  if (!body || typeof body !== 'object') return undefined;
  const b = body as Record<string, unknown>;
  if (b[key] !== undefined) return b[key];
  const td = b.task_data;
  return td && typeof td === 'object' ? (td as Record<string, unknown>)[key] : undefined;
}

/** Parses a request body; bad input is a typed 400 `invalid_request` naming the field. */
export function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.infer<S> {
  const r = schema.safeParse(body ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const where = issue.path.length ? issue.path.map(String).join('.') : 'body';
  throw refuse('invalid_request', `${where}: ${issue.message}`);
}
