// The tiny-policy backend's HTTP surface: OpenAI-compatible chat completions (plain JSON and SSE)
// served from the tabular policy, the generation-cut service (cuts.ts, participants.md §5.6), plus
// the `/_ctl/*` test controls of participants.md §6.1 (holds, call log, call count, cut rounds) and
// the policy weights the trainer refits.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { ChatCompletionRequestSchema } from '../../protocol/openai.js';
import { createGymApp, rolloutOf } from '../common/app.js';
import { sendRefusal } from '../common/metrics.js';
import { GENERATION_CUT_PATH, GenerationCutInventorySchema } from '../model/cut-wire.js';
import { bearerMatches } from '../control/plugin.js';
import { CallLog } from './call-log.js';
import { CutService, inventoryDigestMatches, type ActiveGeneration } from './cuts.js';
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
  /** Bearer token of the generation-cut service (the deployment's control token); absent → no auth. */
  controlToken?: string;
}

/** The backend's live state, exposed for tests and the module. */
export interface InferenceState {
  weights: PolicyWeights;
  log: CallLog;
  holds: Holds;
  cuts: CutService;
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

/** The policy model server's capture admission (`ng_capture`): what the cut service needs of it. */
interface CaptureAdmission {
  raw: Record<string, unknown>;
  model_call_id: string;
  generation_cut: unknown;
}

function captureOf(v: unknown): CaptureAdmission | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const raw = v as Record<string, unknown>;
  if (typeof raw.model_call_id !== 'string' || raw.model_call_id.length === 0) return undefined;
  return { raw, model_call_id: raw.model_call_id, generation_cut: raw.generation_cut ?? undefined };
}

/** `effective_output_limit` of a cut: the request's `max_tokens`, else 1024. */
function outputLimitOf(maxTokens: unknown): number {
  return typeof maxTokens === 'number' && Number.isSafeInteger(maxTokens) && maxTokens >= 1 ? maxTokens : 1024;
}

export function registerInference(app: FastifyInstance, cfg: InferenceConfig): InferenceState {
  const state: InferenceState = { weights: cfg.weights ?? initialWeights(), log: new CallLog(), holds: new Holds(), cuts: new CutService() };
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
    const capture = captureOf(body.ng_capture);
    const promptTokenIds = fakeTokenIds(promptTextOf(body.messages));
    // Decided on arrival: a held call answers with the weights it arrived under.
    let decision = decide({ weights: state.weights, messages: body.messages, rolloutId: episode.rollout_id, salt: cfg.salt });
    // A continued generation cut decodes only what its staged prefix does not already hold.
    let reused = 0;
    let continuedFrom: string | undefined;
    let rejected: string | undefined;
    if (capture?.generation_cut) {
      const check = state.cuts.checkContinuation(capture.generation_cut, { rolloutId: episode.rollout_id, promptTokenIds, version: state.weights.version });
      if (check.ok) {
        decision = check.prefix.decision;
        reused = check.prefix.token_ids.length;
        continuedFrom = check.prefix.model_call_id;
      } else {
        rejected = check.reason;
        req.log.warn({ reason: check.reason }, 'generation-cut continuation refused; decoding from scratch');
      }
    }
    const { record, prior } = state.log.add({
      capture_key: prefix?.key ?? ANONYMOUS_ROLLOUT,
      rollout_id: episode.rollout_id,
      attempt: episode.attempt,
      n_messages: body.messages.length,
      stream,
      situation: decision.situation,
      action: decision.action,
      version: decision.version,
      decoded_tokens: 0,
      ...(capture ? { admission: capture.raw, model_call_id: capture.model_call_id } : {}),
      ...(continuedFrom !== undefined ? { continued_from: continuedFrom, reused_prefix_tokens: reused } : {}),
      ...(rejected !== undefined ? { continuation_rejected: rejected } : {}),
    });
    const meta: ReplyMeta = {
      id: `chatcmpl-${decision.seedHex.slice(0, 24)}`,
      created: Math.floor(Date.now() / 1000),
      model: body.model ?? MODEL_ID,
      promptTokenIds,
    };
    const tokens = completionTokens(decision);
    // A captured call can be cut while it decodes (cuts.ts).
    const gen: ActiveGeneration | undefined = capture
      ? {
          rolloutId: episode.rollout_id,
          attempt: episode.attempt,
          modelCallId: capture.model_call_id,
          decision,
          promptTokenIds,
          tokens,
          generated: reused,
          outputLimit: outputLimitOf(body.max_tokens),
        }
      : undefined;

    const abort = new AbortController();
    const onClose = (): void => {
      if (!reply.raw.writableFinished) abort.abort(new Error('client closed the connection'));
    };
    reply.raw.on('close', onClose);
    inflight.add(abort);
    if (gen) state.cuts.begin(gen);
    const decoded = (i: number): void => {
      record.decoded_tokens++;
      if (gen) gen.generated = i + 1;
    };
    try {
      if (state.holds.applies(record.index, prior, record.capture_key)) await state.holds.wait(abort.signal);
      const pacing = { delayMs, signal: abort.signal, start: reused };
      if (stream) {
        await streamReply(reply, decision, meta, pacing, decoded);
      } else {
        for await (const i of generateTokens(tokens.length, pacing)) decoded(i); // pacing only: the reply is built whole
      }
      record.returned = true;
      return stream ? reply : completionBody(decision, meta);
    } catch (err) {
      if (!abort.signal.aborted) throw err;
      record.abandoned = true;
      return endAbandoned(req, reply, abort.signal.reason);
    } finally {
      if (gen) state.cuts.finish(gen.modelCallId);
      inflight.delete(abort);
      reply.raw.off('close', onClose);
    }
  });

  // --- the generation-cut service (participants.md §5.6): bearer = the deployment's control token ---

  app.post(GENERATION_CUT_PATH, async (req) => {
    if (cfg.controlToken && !bearerMatches(req.headers.authorization, cfg.controlToken)) {
      throw refuse('unauthorized', 'missing or wrong bearer token');
    }
    const inv = parseBody(GenerationCutInventorySchema, req.body, 'generation-cut inventory');
    if (!inventoryDigestMatches(inv)) throw refuse('invalid_request', 'inventory_digest does not match the inventory');
    const receipt = state.cuts.cut(inv);
    req.log.info({ checkpoint_id: inv.checkpoint_id, durable: state.cuts.rounds.at(-1)?.length, asked: inv.active_prefixes.length }, 'generation cut');
    return receipt;
  });
  app.get('/_ctl/cuts', async () => state.cuts.rounds.map((r) => [...r]));

  // --- test controls ---

  app.post('/_ctl/hold', async (req) => {
    state.holds.place(parseBody(HoldRequestSchema, req.body, 'hold'));
    return { ok: true };
  });
  app.post('/_ctl/release', async () => ({ ok: true, released: state.holds.release() }));
  app.post('/_ctl/reset', async () => {
    const released = state.holds.release();
    state.log.reset();
    state.cuts.reset();
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

async function streamReply(
  reply: FastifyReply,
  d: PolicyDecision,
  meta: ReplyMeta,
  opts: { delayMs: number; signal: AbortSignal; start: number },
  decoded: (i: number) => void,
): Promise<void> {
  const tokens = completionTokens(d);
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive' });
  // A reused prefix goes out at once; only the rest is decoded.
  for (let i = 0; i < Math.min(opts.start, tokens.length); i++) res.write(`data: ${JSON.stringify(tokenChunk(d, meta, i, tokens[i]!))}\n\n`);
  for await (const i of generateTokens(tokens.length, opts)) {
    decoded(i);
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
    return sendRefusal(reply, refuse('shutting_down', 'the inference server is closing'));
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
