// The front of a multi-worker server (docs/multi-worker.md): the server's one URL. It answers
// `/healthz` and `/metrics` itself, serves the control routes as the one participant
// (coordinator.ts), and hands every other request to the worker that owns its rollout (owner.ts),
// byte for byte, as a stream of the front's one HTTP/2 connection to that worker's Unix socket. Requests that name no rollout spread round-robin.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import http2 from 'node:http2';
import { assertExpectedInstance, INSTANCE_HEADER } from '../../protocol/tasks.js';
import { createGymApp } from '../common/app.js';
import { mountControlPlane } from '../control/plugin.js';
import type { WorkerCoordinator } from './coordinator.js';
import { ownerOf, rolloutOfRunBody, rolloutOfUrl } from './owner.js';
import { responseOf, WorkerLink } from './worker-link.js';

export interface FrontOptions {
  name: string;
  kind: string;
  sockets: readonly string[];
  /** Set when checkpointing is on: the control routes, fanned out to the workers. */
  coordinator?: WorkerCoordinator;
  token?: string;
  logLevel?: string;
}

// Hop-by-hop headers (RFC 9110 §7.6.1), which HTTP/2 forbids, and the ones the next hop sets itself.
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'host', 'content-length']);
const HOP_BY_HOP_REPLY = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'trailer', 'upgrade']);

export async function buildFront(opts: FrontOptions): Promise<FastifyInstance> {
  const app = createGymApp({ name: opts.name, kind: opts.kind, logLevel: opts.logLevel });
  const links = opts.sockets.map((socket) => new WorkerLink(socket));
  app.addHook('onClose', async () => {
    for (const l of links) l.close();
  });
  if (opts.coordinator) await mountControlPlane(app, { plane: opts.coordinator, token: opts.token! });
  let next = 0;

  await app.register(async (data) => {
    // Bodies pass through untouched; only an environment `/run` is read, for its rollout ID.
    data.removeAllContentTypeParsers();
    data.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
    data.all('/*', async (req: FastifyRequest, reply: FastifyReply) => {
      const url = req.originalUrl;
      const body = Buffer.isBuffer(req.body) ? req.body : undefined;
      let rollout = rolloutOfUrl(url);
      if (rollout === undefined && req.method === 'POST' && req.url.split('?')[0] === '/run' && body) {
        rollout = rolloutOfRunBody(body);
        // The controller names the environment instance it dispatched to: the server's, not a worker's.
        if (opts.coordinator) assertExpectedInstance(req.headers[INSTANCE_HEADER], opts.coordinator.instanceId);
      }
      const worker = rollout === undefined ? next++ % links.length : ownerOf(rollout, links.length);
      return forward(links[worker]!, req, reply, url, body);
    });
  });
  return app;
}

async function forward(link: WorkerLink, req: FastifyRequest, reply: FastifyReply, url: string, body: Buffer | undefined): Promise<FastifyReply> {
  const headers: http2.OutgoingHttpHeaders = { ':method': req.method, ':path': url };
  for (const [k, v] of Object.entries(req.headers)) {
    if (v === undefined || HOP_BY_HOP.has(k) || k === INSTANCE_HEADER) continue;
    headers[k] = v;
  }
  const stream = link.request(headers, body);
  // A caller that gives up (a cancelled episode, a crash) gives up on the worker too.
  const onClose = (): void => {
    if (!reply.raw.writableEnded) stream.close(http2.constants.NGHTTP2_CANCEL);
  };
  reply.raw.once('close', onClose);
  let head: http2.IncomingHttpHeaders;
  try {
    head = await responseOf(stream);
  } catch {
    // No answer from the worker (it withheld one, or it is gone): none for the caller either.
    reply.hijack();
    reply.raw.destroy();
    return reply;
  }
  reply.code(Number(head[':status']));
  for (const [k, v] of Object.entries(head)) if (v !== undefined && !k.startsWith(':') && !HOP_BY_HOP_REPLY.has(k)) reply.header(k, v);
  // Streamed through (a model's event stream arrives as it is generated).
  return reply.send(stream);
}
