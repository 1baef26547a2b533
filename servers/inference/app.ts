// The tiny-policy backend's HTTP surface: OpenAI-compatible chat completions (plain JSON and SSE)
// served from the tabular policy, plus the `/_ctl/*` test controls of participants.md §6.1
// (holds, call log, call count) and the policy weights the trainer refits.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { ChatCompletionRequestSchema } from '../../protocol/openai.js';
import { createGymApp, rolloutOf } from '../common/app.js';
import { CallLog } from './call-log.js';
import { generateTokens } from './generation.js';
import { HoldRequestSchema, Holds } from './holds.js';
import { PolicyWeightsSchema, decide, initialWeights, type PolicyDecision, type PolicyWeights } from './policy.js';
import { MODEL_ID, completionBody, completionTokens, fakeTokenIds, finalChunk, promptTextOf, tokenChunk, type ReplyMeta } from './reply.js';

export const ANONYMOUS_ROLLOUT = 'anonymous';

export interface InferenceConfig {
  name: string;
  logLevel?: string;
  /** Mixed into every sampling seed when set (a different but equally deterministic run). */
  salt?: number;
  tokenDelayMs?: number;
  weights?: PolicyWeights;
}

/** The backend's live state, exposed for tests and the module. */
export interface InferenceState {
  weights: PolicyWeights;
  log: CallLog;
  holds: Holds;
}

/** Parses a body with a schema; the first issue becomes a 400 `invalid_request`. */
function parseBody<S extends z.ZodType>(schema: S, body: unknown, what: string): z.infer<S> {
  const r = schema.safeParse(body ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const where = issue.path.length ? ` at ${issue.path.map(String).join('.')}` : '';
  throw refuse('invalid_request', `${what}${where}: ${issue.message}`);
}

const SHUTDOWN = Symbol('shutdown');

export function registerInference(app: FastifyInstance, cfg: InferenceConfig): InferenceState {
  const state: InferenceState = { weights: cfg.weights ?? initialWeights(), log: new CallLog(), holds: new Holds() };
  const delayMs = cfg.tokenDelayMs ?? 0;
  // Calls in flight (held or generating), so closing the server ends them instead of hanging.
  const inflight = new Set<AbortController>();
  app.addHook('preClose', async () => {
    for (const c of inflight) c.abort(SHUTDOWN);
  });

  app.get('/v1/models', async () => ({
    object: 'list',
    data: [{ id: MODEL_ID, object: 'model', created: 0, owned_by: 'rollout-checkpoint' }],
  }));

  app.post('/v1/chat/completions', async (req, reply) => {
    const prefix = rolloutOf(req);
    if (prefix && !prefix.episode) throw refuse('invalid_rollout_id', `'${prefix.key}' is not a valid capture key`);
    const body = parseBody(ChatCompletionRequestSchema, req.body, 'chat completion request');
    const episode = prefix?.episode ?? { rollout_id: ANONYMOUS_ROLLOUT, attempt: 0 };
    const stream = body.stream === true;
    // Decided on arrival: a held call answers with the weights it arrived under.
    const decision = decide({ weights: state.weights, messages: body.messages, rolloutId: episode.rollout_id, salt: cfg.salt });
    const { record, prior } = state.log.add({
      capture_key: prefix?.key ?? ANONYMOUS_ROLLOUT,
      rollout_id: episode.rollout_id,
      attempt: episode.attempt,
      n_messages: body.messages.length,
      stream,
      situation: decision.situation,
      action: decision.action,
      version: decision.version,
    });
    const meta: ReplyMeta = {
      id: `chatcmpl-${decision.seedHex.slice(0, 24)}`,
      created: Math.floor(Date.now() / 1000),
      model: body.model ?? MODEL_ID,
      promptTokenIds: fakeTokenIds(promptTextOf(body.messages)),
    };

    const abort = new AbortController();
    const onClose = (): void => {
      if (!reply.raw.writableFinished) abort.abort(new Error('client closed the connection'));
    };
    reply.raw.on('close', onClose);
    inflight.add(abort);
    try {
      if (state.holds.applies(record.index, prior)) await state.holds.wait(abort.signal);
      if (stream) {
        await streamReply(reply, decision, meta, { delayMs, signal: abort.signal });
      } else {
        for await (const _ of generateTokens(completionTokens(decision).length, { delayMs, signal: abort.signal })) {
          /* pacing only: the reply is built whole */
        }
      }
      record.returned = true;
      return stream ? reply : completionBody(decision, meta);
    } catch (err) {
      if (!abort.signal.aborted) throw err;
      record.abandoned = true;
      return endAbandoned(req, reply, abort.signal.reason);
    } finally {
      inflight.delete(abort);
      reply.raw.off('close', onClose);
    }
  });

  // --- test controls ---

  app.post('/_ctl/hold', async (req) => {
    state.holds.place(parseBody(HoldRequestSchema, req.body, 'hold'));
    return { ok: true };
  });
  app.post('/_ctl/release', async () => ({ ok: true, released: state.holds.release() }));
  app.post('/_ctl/reset', async () => {
    const released = state.holds.release();
    state.log.reset();
    return { ok: true, released };
  });
  app.get('/_ctl/call_count', async () => ({ count: state.log.count }));
  app.get('/_ctl/calls', async () => state.log.list());
  app.get('/_ctl/policy', async () => state.weights);
  app.post('/_ctl/policy', async (req) => {
    state.weights = parseBody(PolicyWeightsSchema, req.body, 'policy weights');
    req.log.info({ version: state.weights.version }, 'policy weights loaded');
    return { ok: true, version: state.weights.version };
  });
  return state;
}

async function streamReply(reply: FastifyReply, d: PolicyDecision, meta: ReplyMeta, opts: { delayMs: number; signal: AbortSignal }): Promise<void> {
  const tokens = completionTokens(d);
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive' });
  for await (const i of generateTokens(tokens.length, opts)) {
    res.write(`data: ${JSON.stringify(tokenChunk(d, meta, i, tokens[i]!))}\n\n`);
  }
  res.write(`data: ${JSON.stringify(finalChunk(d, meta, tokens.length))}\n\n`);
  res.write('data: [DONE]\n\n');
  await new Promise<void>((resolve) => res.end(resolve));
}

/** A call that ended before its reply: nothing to send to a gone client; 503 when the server closes. */
function endAbandoned(req: FastifyRequest, reply: FastifyReply, reason: unknown): FastifyReply {
  const res = reply.raw;
  if (reason === SHUTDOWN && !res.headersSent && !res.destroyed) {
    return reply.code(503).send({ error: { code: 'shutting_down', detail: 'the inference server is closing' } });
  }
  req.log.info('chat call abandoned');
  if (!reply.sent) reply.hijack();
  res.destroy();
  return reply;
}

export async function buildInferenceApp(cfg: InferenceConfig): Promise<{ app: FastifyInstance; state: InferenceState }> {
  const app = createGymApp({ name: cfg.name, kind: 'inference', logLevel: cfg.logLevel });
  const state = registerInference(app, cfg);
  return { app, state };
}
