// The policy model server's data plane: OpenAI-compatible routes relayed to the inference backend
// under the caller's own `/ng-rollout/<key>` prefix (so the backend knows the episode), bytes
// passed through as they arrive (a streamed reply is never buffered), every generation call
// going through the gate (gate.ts) where the checkpoint participant will hook in.
import type { IncomingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { request } from 'undici';
import { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { rolloutPath } from '../../protocol/ids.js';
import { rolloutOf } from '../common/app.js';
import { dataAgent, joinPath } from '../common/http-client.js';
import type { GenerationCall, GenerationGate } from './gate.js';
import { ResponseStartDetector } from './response-start.js';

export interface ModelProxyOptions {
  /** Backend root (no trailing `/v1`): calls go to `<root>[/ng-rollout/<key>]/v1/...`. */
  backendRoot: string;
  gate: GenerationGate;
}

/** Generation routes (participants.md §5.1); the tiny policy backend serves chat completions. */
export const GENERATION_ROUTES = ['/v1/chat/completions'] as const;

const ChatRequestSchema = z.looseObject({ messages: z.array(z.unknown()) });

/** Hop-by-hop headers belong to one connection and are never relayed. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authenticate',
  'proxy-authorization',
]);

/** An OpenAI-style base URL may end with `/v1`; the root is what the `/ng-rollout` prefix goes after. */
export function backendRootOf(url: string): string {
  return url.replace(/\/+$/, '').replace(/\/v1$/, '');
}

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
    const abort = abortOnCallerGone(reply);
    const upstream = await forward(req, reply, opts.backendRoot, { method: 'GET', signal: abort.signal });
    if (!upstream) return reply;
    return reply.send(upstream.body);
  });
}

async function generate(req: FastifyRequest, reply: FastifyReply, route: string, opts: ModelProxyOptions): Promise<FastifyReply> {
  const parsed = ChatRequestSchema.safeParse(req.body);
  if (!parsed.success) throw refuse('invalid_request', `${route}: the body must be a JSON object with a messages array`);
  const rollout = rolloutOf(req);
  const abort = abortOnCallerGone(reply);
  const call: GenerationCall = { key: rollout?.key, episode: rollout?.episode, route, body: parsed.data, signal: abort.signal };

  await opts.gate.beforeForward(call);
  let ended = false;
  const end = (): void => {
    if (ended) return;
    ended = true;
    opts.gate.onEnd(call);
  };
  if (reply.raw.destroyed) {
    // The caller left while admission held the call: nothing to send.
    end();
    return reply.hijack();
  }
  reply.raw.once('close', end);

  const upstream = await forward(req, reply, opts.backendRoot, {
    method: 'POST',
    body: JSON.stringify(parsed.data),
    signal: abort.signal,
  });
  if (!upstream) return reply;
  const detector = new ResponseStartDetector(isEventStream(upstream.headers));
  return reply.send(Readable.from(relay(upstream.body, detector, () => opts.gate.onFirstChunk(call)), { objectMode: false }));
}

/** Passes each chunk on as it arrives; the response starts at the first chunk carrying data. */
async function* relay(
  body: AsyncIterable<Uint8Array>,
  detector: ResponseStartDetector,
  onStart: () => void | Promise<void>,
): AsyncGenerator<Uint8Array> {
  for await (const chunk of body) {
    if (!detector.hasStarted && detector.push(chunk)) await onStart();
    yield chunk;
  }
}

interface Upstream {
  headers: IncomingHttpHeaders;
  body: AsyncIterable<Uint8Array> & NodeJS.ReadableStream;
}

/**
 * Sends the call to the backend under the same prefix and copies status and headers onto the
 * reply. Returns undefined when the reply was already answered (backend unreachable).
 */
async function forward(
  req: FastifyRequest,
  reply: FastifyReply,
  backendRoot: string,
  init: { method: 'GET' | 'POST'; body?: string; signal: AbortSignal },
): Promise<Upstream | undefined> {
  const rollout = rolloutOf(req);
  const path = rollout ? rolloutPath(rollout.key, req.url) : req.url;
  const url = joinPath(backendRoot, path);
  const headers: Record<string, string> = {};
  if (init.body !== undefined) headers['content-type'] = 'application/json';
  if (typeof req.headers.accept === 'string') headers.accept = req.headers.accept;
  let res: Awaited<ReturnType<typeof request>>;
  try {
    res = await request(url, { method: init.method, headers, body: init.body, signal: init.signal, dispatcher: dataAgent() });
  } catch (err) {
    if (init.signal.aborted) {
      reply.hijack(); // the caller is gone: nobody to answer
      return undefined;
    }
    req.log.warn({ err, url }, 'inference backend unreachable');
    // 502: the backend, not this server, failed; callers treat it as transient.
    reply.code(502).send({ error: { code: 'backend_unavailable', detail: `${url}: ${(err as Error).message}` } });
    return undefined;
  }
  reply.code(res.statusCode);
  for (const [name, value] of Object.entries(res.headers)) {
    if (value !== undefined && !HOP_BY_HOP.has(name.toLowerCase())) reply.header(name, value);
  }
  return { headers: res.headers, body: res.body };
}

function isEventStream(headers: IncomingHttpHeaders): boolean {
  const ct = headers['content-type'];
  return typeof ct === 'string' && ct.toLowerCase().startsWith('text/event-stream');
}

/** Aborts the backend call when the caller disconnects before the reply is complete. */
function abortOnCallerGone(reply: FastifyReply): AbortController {
  const abort = new AbortController();
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) abort.abort(new Error('the caller went away'));
  });
  return abort;
}
