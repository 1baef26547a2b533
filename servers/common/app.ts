// The Fastify app every Gym server starts from: pino logging, `/healthz`, `/metrics`, the typed
// error envelope (each one counted), and the `/ng-rollout/<capture key>` prefix stripped before
// routing (control-plane.md §2.4) with the decoded episode kept on the request.
import type { IncomingMessage } from 'node:http';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { isProtocolError, ProtocolError } from '../../protocol/errors.js';
import { parseRolloutPath, type RolloutPath } from '../../protocol/ids.js';
import { SERVER_KEEP_ALIVE_MS } from '../../protocol/keep-alive.js';
import { sendRefusal, serveMetrics } from './metrics.js';
import { traceGymRequests, tracingOn } from './tracing.js';

const ROLLOUT = Symbol('ngRollout');
type WithRollout = IncomingMessage & { [ROLLOUT]?: RolloutPath };

export interface GymAppOptions {
  name: string;
  kind: string;
  /** pino level; `silent` in tests that do not want logs. */
  logLevel?: string;
  bodyLimit?: number;
  /** Node process metrics (CPU, memory, GC, event loop) in `/metrics` too; default true. */
  processMetrics?: boolean;
  /** A multi-worker server's front: its workers' metrics, added to its own (metrics.ts). */
  workerMetrics?: () => Promise<unknown[][]>;
}

export function createGymApp(opts: GymAppOptions): FastifyInstance {
  const app = Fastify({
    logger: { level: opts.logLevel ?? process.env.LOG_LEVEL ?? 'info', base: { server: opts.name, kind: opts.kind } },
    bodyLimit: opts.bodyLimit ?? 64 * 1024 * 1024,
    // Long /run calls and parked requests must not be cut by the server side.
    requestTimeout: 0,
    keepAliveTimeout: SERVER_KEEP_ALIVE_MS,
    rewriteUrl(req) {
      const url = req.url ?? '/';
      const parsed = parseRolloutPath(url);
      if (!parsed) return url;
      (req as WithRollout)[ROLLOUT] = parsed;
      return parsed.rest;
    },
  });
  // Decided once per app: a process that does not trace has no tracing hooks at all.
  if (tracingOn()) traceGymRequests(app, { name: opts.name, kind: opts.kind });
  app.get('/healthz', async () => ({ ok: true, server: opts.name, kind: opts.kind }));
  serveMetrics(app, { processMetrics: opts.processMetrics, workerMetrics: opts.workerMetrics });
  app.setErrorHandler((err, req, reply) => {
    if (isProtocolError(err)) return sendRefusal(reply, err);
    const e = err as { statusCode?: number; code?: string; message?: string; validation?: unknown };
    if (e.statusCode && e.statusCode >= 400 && e.statusCode < 500) {
      return sendRefusal(reply, new ProtocolError('invalid_request', e.message ?? 'invalid request', e.statusCode));
    }
    req.log.error({ err }, 'request failed');
    return reply.code(500).type('text/plain').send('Internal Server Error');
  });
  return app;
}

/** The `/ng-rollout/<key>` prefix of this request, if it had one. */
export function rolloutOf(req: FastifyRequest): RolloutPath | undefined {
  return (req.raw as WithRollout)[ROLLOUT];
}
