// The policy model server's data plane: OpenAI-compatible routes relayed to the backend — ours
// under the caller's own `/ng-rollout/<key>` prefix (so it knows the episode), a third-party one as
// a plain OpenAI call (backend.ts says what each receives). Every generation call goes through the
// gate (gate.ts), where the checkpoint participant admits it, holds its response while a checkpoint
// is open and records it at response start.
//
// A streamed reply is relayed chunk by chunk (never buffered); its response starts at the first
// chunk carrying data (response-start.ts). A plain JSON reply is one unit: it is read whole, then
// started, then sent — so a reply the backend finishes while a checkpoint is open is held here.
import type { IncomingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { isProtocolError, refuse } from '../../protocol/errors.js';
import { rolloutOf } from '../common/app.js';
import { sendRefusal } from '../common/metrics.js';
import { backendBody, callBackend, mapBackendError, type Backend, type Upstream } from './backend.js';
import type { AdmittedCall, GenerationCall, GenerationGate } from './gate.js';
import { SseCollector, tokensOfCompletion } from './reply-tokens.js';
import { ResponseStartDetector } from './response-start.js';
import { isHopByHop } from '../common/hop-by-hop.js';

export interface ModelProxyOptions {
  backend: Backend;
  gate: GenerationGate;
}

/** Generation routes (participants.md §5.1); the tiny policy backend serves chat completions. */
export const GENERATION_ROUTES = ['/v1/chat/completions'] as const;

const ChatRequestSchema = z.looseObject({ messages: z.array(z.unknown()) });

export { backendRootOf } from './backend.js';

export function registerModelProxy(app: FastifyInstance, opts: ModelProxyOptions): void {
  // A prefix the app could not decode (bad characters, a reserved suffix on the rollout ID) must
  // not be routed as if it belonged to no episode (§5.2 step 1).
  app.addHook('onRequest', async (req) => {
    const rollout = rolloutOf(req);
    if (rollout ? rollout.episode === undefined : /^\/ng-rollout(\/|$)/.test(req.url)) {
      throw refuse('invalid_rollout_id', `malformed /ng-rollout/<capture key> prefix in ${req.originalUrl}`);
    }
  });

  for (const route of GENERATION_ROUTES) {
    app.post(route, (req, reply) => generate(req, reply, route, opts));
  }
  app.get('/v1/models', async (req, reply) => {
    const gone = abortOnCallerGone(reply);
    let upstream: Upstream;
    try {
      upstream = await forward(req, opts.backend, { method: 'GET', signal: gone.signal });
    } catch (err) {
      return backendFailed(req, reply, err, gone.signal);
    }
    applyHead(reply, upstream);
    return reply.send(upstream.body);
  });
}

/** The gate refused to let the reply out (write failed, or the call was cancelled). */
class Undeliverable extends Error {}

async function generate(req: FastifyRequest, reply: FastifyReply, route: string, opts: ModelProxyOptions): Promise<FastifyReply> {
  const parsed = ChatRequestSchema.safeParse(req.body);
  if (!parsed.success) throw refuse('invalid_request', `${route}: the body must be a JSON object with a messages array`);
  const rollout = rolloutOf(req);
  const gone = abortOnCallerGone(reply);
  const call: GenerationCall = { key: rollout?.key, episode: rollout?.episode, route, body: parsed.data, signal: gone.signal };

  let admitted: AdmittedCall;
  try {
    admitted = await opts.gate.admit(call);
  } catch (err) {
    if (gone.signal.aborted) return backendFailed(req, reply, err, gone.signal);
    throw err; // refusals (stale_attempt) become the reply through the app's error handler
  }
  let ended = false;
  const end = (): void => {
    if (ended) return;
    ended = true;
    admitted.end();
  };
  if (reply.raw.destroyed || gone.signal.aborted) {
    // The caller left while admission held the call: nothing to send.
    end();
    return reply.hijack();
  }
  reply.raw.once('close', end);
  const signal = AbortSignal.any([gone.signal, admitted.signal]);

  let upstream: Upstream;
  try {
    upstream = await forward(req, opts.backend, { method: 'POST', body: backendBody(opts.backend, admitted.backendBody), signal });
  } catch (err) {
    return backendFailed(req, reply, admitted.signal.aborted ? admitted.signal.reason : err, gone.signal);
  }
  if (isEventStream(upstream.headers)) {
    applyHead(reply, upstream);
    return reply.send(Readable.from(relayStream(upstream, admitted), { objectMode: false }));
  }
  try {
    const chunks: Buffer[] = [];
    for await (const c of upstream.body) chunks.push(Buffer.from(c));
    const buf = Buffer.concat(chunks);
    const body = parseJson(buf);
    const ok = upstream.status >= 200 && upstream.status < 300;
    // A failed call is held like a reply (the caller must not learn anything while a checkpoint is
    // open) and captures nothing.
    await deliverOrFail(admitted, { status: upstream.status, stream: false, ...(body !== undefined ? { body } : {}) });
    if (ok) await completeOrFail(admitted, tokensOfCompletion(body));
    if (upstream.status === 404 && opts.backend.api === 'ng' && call.key !== undefined) {
      req.log.warn(
        { backend: opts.backend.root },
        'the backend has no route under /ng-rollout/<key>: a third-party OpenAI-compatible server needs backend_api: openai',
      );
    }
    if (!ok && opts.backend.api === 'openai') {
      const failure = mapBackendError(upstream.status, buf);
      req.log.warn({ status: upstream.status, code: failure.code }, 'the backend refused a generation call');
      return sendRefusal(reply, failure);
    }
    applyHead(reply, upstream);
    return reply.send(buf);
  } catch (err) {
    return undelivered(req, reply, err, gone.signal, admitted);
  }
}

async function deliverOrFail(admitted: AdmittedCall, start: Parameters<AdmittedCall['deliver']>[0]): Promise<void> {
  try {
    await admitted.deliver(start);
  } catch (err) {
    throw err instanceof Undeliverable ? err : Object.assign(new Undeliverable('not delivered'), { cause: err });
  }
}

async function completeOrFail(admitted: AdmittedCall, tokens: Parameters<AdmittedCall['complete']>[0]): Promise<void> {
  try {
    await admitted.complete(tokens);
  } catch (err) {
    throw Object.assign(new Undeliverable('tokens not staged'), { cause: err });
  }
}

/** Relays a stream chunk by chunk; the first chunk carrying data waits for the gate. */
async function* relayStream(upstream: Upstream, admitted: AdmittedCall): AsyncGenerator<Uint8Array> {
  const detector = new ResponseStartDetector(true);
  const collector = new SseCollector();
  const ok = upstream.status >= 200 && upstream.status < 300;
  let finished = false;
  try {
    for await (const chunk of upstream.body) {
      const events = collector.push(chunk);
      if (!detector.hasStarted && detector.push(chunk)) {
        // A throw here (poisoned or cancelled) destroys the reply: the caller gets no data.
        await admitted.deliver({ status: upstream.status, stream: true, events });
      }
      yield chunk;
    }
    if (!detector.hasStarted) await admitted.deliver({ status: upstream.status, stream: true, events: [] });
    finished = true;
    if (ok) await admitted.complete(collector.result());
  } finally {
    // A started stream cut short (caller gone, backend failed) still stages what it relayed.
    if (!finished && ok && detector.hasStarted) void admitted.complete({ ...collector.result(), complete: false }).catch(() => undefined);
  }
}

/**
 * The reply could not be delivered. A cancelled call (retire) answers its refusal when nothing was
 * sent yet; a poisoned one (ledger write failed) and a gone caller get no answer at all.
 */
function undelivered(req: FastifyRequest, reply: FastifyReply, err: unknown, gone: AbortSignal, admitted: AdmittedCall): FastifyReply {
  const cause = err instanceof Undeliverable ? (err as Error & { cause?: unknown }).cause : err;
  const refusal = admitted.signal.aborted ? admitted.signal.reason : undefined;
  if (!gone.aborted && isProtocolError(refusal) && !reply.raw.headersSent) {
    return sendRefusal(reply, refusal);
  }
  if (!gone.aborted) req.log.warn({ err: cause }, 'model reply withheld: no answer is sent');
  if (!reply.sent) reply.hijack();
  reply.raw.destroy();
  return reply;
}

function parseJson(buf: Buffer): unknown {
  if (buf.length === 0) return undefined;
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch {
    return undefined;
  }
}

/** Sends the call to the backend (ours: under the same prefix). */
function forward(
  req: FastifyRequest,
  backend: Backend,
  init: { method: 'GET' | 'POST'; body?: Record<string, unknown>; signal: AbortSignal },
): Promise<Upstream> {
  return callBackend(backend, {
    method: init.method,
    path: req.url,
    key: rolloutOf(req)?.key,
    ...(init.body !== undefined ? { body: init.body } : {}),
    ...(typeof req.headers.accept === 'string' ? { accept: req.headers.accept } : {}),
    signal: init.signal,
  });
}

/** Status and end-to-end headers of the backend's reply, copied onto ours. */
function applyHead(reply: FastifyReply, upstream: Upstream): void {
  reply.code(upstream.status);
  for (const [name, value] of Object.entries(upstream.headers)) {
    if (value !== undefined && !isHopByHop(name)) reply.header(name, value);
  }
}

/**
 * No reply from the backend: `backend_unavailable` (502) or `backend_timeout` (504), both retryable;
 * the refusal of a cancelled call; or nothing for a gone caller.
 */
function backendFailed(req: FastifyRequest, reply: FastifyReply, err: unknown, gone: AbortSignal): FastifyReply {
  if (gone.aborted) {
    reply.hijack(); // the caller is gone: nobody to answer
    reply.raw.destroy();
    return reply;
  }
  const failure = isProtocolError(err) ? err : refuse('backend_unavailable', `${req.url}: ${(err as Error).message}`);
  if (failure.code === 'backend_unavailable' || failure.code === 'backend_timeout')
    req.log.warn({ code: failure.code, detail: failure.detail }, 'the backend did not answer');
  return sendRefusal(reply, failure);
}

function isEventStream(headers: IncomingHttpHeaders): boolean {
  const ct = headers['content-type'];
  return typeof ct === 'string' && ct.toLowerCase().startsWith('text/event-stream');
}

/** Aborts the backend call when the caller disconnects before the reply is complete. */
function abortOnCallerGone(reply: FastifyReply): AbortController {
  const abort = new AbortController();
  reply.raw.once('close', () => {
    // `writableEnded`: false until we answered, whatever the transport (an HTTP/2 stream reset by
    // its peer reports `writableFinished`).
    if (!reply.raw.writableEnded) abort.abort(new Error('the caller went away'));
  });
  return abort;
}
