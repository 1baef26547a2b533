// The agent's data-plane routes (participants.md §3.1). `/ng-rollout/<key>` is stripped by
// createGymApp before routing; `rolloutOf(req)` gives the episode. Legacy `/run` (§3.9) and
// `/aggregate_metrics` are not served.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { rolloutOf } from '../common/app.js';
import { sendRefusal } from '../common/metrics.js';
import { SESSION_COOKIE, parseCookieHeader, setCookieValue, signSession, verifySession } from '../common/session-cookie.js';
import { handleActivation } from './activate.js';
import { ACTIVATION_HEADER } from './activation-index.js';
import { closeSession } from './close.js';
import type { AgentCore } from './core.js';
import { UpstreamError } from './peers.js';
import { RESTART_HEADER } from './restart-only.js';
import { seedSession } from './seed.js';
import { ActivationBodySchema, CloseRequestSchema, SeedRequestSchema } from './wire.js';

function parseBody<S extends z.ZodType>(schema: S, body: unknown, what: string): z.infer<S> {
  const r = schema.safeParse(body ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  throw refuse('invalid_request', `${what}: ${issue.path.join('.') || 'body'}: ${issue.message}`);
}

/** The agent session the signed `session` cookie names; undefined without the cookie. */
function sessionKeyOf(core: AgentCore, req: FastifyRequest): string | undefined {
  const value = parseCookieHeader(req.headers.cookie)[SESSION_COOKIE];
  if (value === undefined) return undefined;
  const data = verifySession(core.sessionSecret, value);
  if (!data || typeof data.agent_session_id !== 'string') throw refuse('invalid_request', 'the session cookie is not valid');
  return data.agent_session_id;
}

export function registerAgentRoutes(app: FastifyInstance, core: AgentCore): void {
  app.post('/v1/agent_sessions', async (req, reply) => {
    const body = parseBody(SeedRequestSchema, req.body, 'seed request');
    const out = await seedSession(core, body, rolloutOf(req));
    reply.header('set-cookie', setCookieValue(SESSION_COOKIE, signSession(core.sessionSecret, { agent_session_id: out.reply.agent_session_id })));
    if (core.checkpointing && core.mode === 'restart_only') reply.header(RESTART_HEADER, '1');
    return out.reply;
  });

  app.post('/v1/agent_sessions/close', async (req) => {
    const body = parseBody(CloseRequestSchema, req.body, 'close request');
    return closeSession(core, body, rolloutOf(req));
  });

  const responses = async (req: FastifyRequest, reply: FastifyReply) => {
    const body = parseBody(ActivationBodySchema, req.body, 'responses request');
    try {
      const out = await handleActivation(core, {
        rollout: rolloutOf(req),
        sessionKey: sessionKeyOf(core, req),
        indexHeader: req.headers[ACTIVATION_HEADER],
        body,
      });
      const cookies = Object.entries(out.cookies).map(([k, v]) => setCookieValue(k, v));
      if (cookies.length) reply.header('set-cookie', cookies);
      return out.response;
    } catch (err) {
      // A peer failed: retryable for the caller (HTTP ≥ 500), with a typed body.
      if (err instanceof UpstreamError) return sendRefusal(reply, refuse(err.code, err.message));
      throw err;
    }
  };
  app.post('/v1/responses', responses);
  app.post('/training-token-capture/v1/responses', responses);
}
