// The front of a multi-worker server (docs/multi-worker.md): the server's one URL. It reads the
// start of each connection's first request and hands the connection to the worker that owns the
// request's rollout (owner.ts, handoff.ts); requests that name no rollout spread round-robin.
// `/healthz`, `/metrics` (its own and its workers', added up) and the control routes it serves
// itself (the control routes as the one participant, coordinator.ts), on the same connection.
import type { ChildProcess } from 'node:child_process';
import net from 'node:net';
import type { FastifyInstance } from 'fastify';
import { refuse } from '../../protocol/errors.js';
import { SERVER_LISTEN_BACKLOG } from '../../protocol/keep-alive.js';
import { createGymApp } from '../common/app.js';
import { WORKER_METRICS_PATH } from '../common/metrics.js';
import { mountControlPlane } from '../control/plugin.js';
import { ControlLink } from './control-link.js';
import type { WorkerCoordinator } from './coordinator.js';
import { isFrontRoute } from './front-routes.js';
import { handOff, serveConnection } from './handoff.js';
import { isRunRequest, ownerOf, rolloutOfRunBody, rolloutOfUrl } from './owner.js';
import { readRequestStart, type RequestStart } from './request-start.js';

export interface FrontOptions {
  name: string;
  kind: string;
  /** The worker processes, in worker order (their IPC channels take the connections). */
  workers: readonly ChildProcess[];
  /** Their Unix sockets, in worker order (the front reads their metrics there). */
  sockets: readonly string[];
  /** Set when checkpointing is on: the control routes, fanned out to the workers. */
  coordinator?: WorkerCoordinator;
  token?: string;
  logLevel?: string;
}

export interface Front {
  /** The front's own app: health, metrics, the control plane. */
  app: FastifyInstance;
  listen(port: number): Promise<void>;
  close(): Promise<void>;
}

/** The largest environment `/run` body the front reads for its rollout (the app's own limit). */
const MAX_RUN_BODY_BYTES = 64 * 1024 * 1024;

export async function buildFront(opts: FrontOptions): Promise<Front> {
  // `/metrics` is the whole server's: the front's own and every worker's, added up.
  const metricLinks = opts.sockets.map((socket) => new ControlLink(socket, 1));
  const workerMetrics = (): Promise<unknown[][]> =>
    Promise.all(
      metricLinks.map(async (link, i) => {
        const res = await link.call('GET', WORKER_METRICS_PATH, {});
        if (res.status !== 200) throw new Error(`worker ${i} answered its metrics with HTTP ${res.status}`);
        return JSON.parse(res.text) as unknown[];
      }),
    );
  const app = createGymApp({ name: opts.name, kind: opts.kind, logLevel: opts.logLevel, workerMetrics });
  if (opts.coordinator) await mountControlPlane(app, { plane: opts.coordinator, token: opts.token! });
  // A /run reaches the front's own app only when it could not route it; anything else not a route
  // of the front is a 404, as on a single-process server.
  app.post('/run', async (req) => {
    throw refuse(
      'invalid_request',
      `${req.method} ${req.url}: a server with workers reads the rollout of a /run before it hands it to one: send the body with a content-length, at most ${MAX_RUN_BODY_BYTES} bytes`,
    );
  });
  // The front's own answers close their connection: the caller's next request may belong to a worker.
  app.server.prependListener('request', (_req, res) => res.setHeader('connection', 'close'));
  await app.ready();

  let next = 0;
  const route = async (socket: net.Socket): Promise<void> => {
    socket.on('error', () => socket.destroy());
    const start = await readRequestStart(socket, isRun, MAX_RUN_BODY_BYTES);
    if (!start) return;
    const worker = start.malformed || isFrontRoute(start.target) ? undefined : ownerOfRequest(start, opts.workers.length, () => next++);
    if (worker === undefined) serveConnection(app.server, socket, start.bytes);
    else handOff(opts.workers[worker]!, socket, start.bytes);
  };
  const server = net.createServer((socket) => void route(socket));
  return {
    app,
    listen: (port) =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen({ port, host: '127.0.0.1', backlog: SERVER_LISTEN_BACKLOG }, () => resolve());
      }),
    close: async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await app.close();
      await Promise.all(metricLinks.map((l) => l.close()));
    },
  };
}

function isRun(start: RequestStart): boolean {
  return isRunRequest(start.method, start.target);
}

/** The worker of a request; undefined for a `/run` the front could not read (its own app refuses it). */
function ownerOfRequest(start: RequestStart, workers: number, roundRobin: () => number): number | undefined {
  let rollout = rolloutOfUrl(start.target);
  if (rollout === undefined && isRun(start)) {
    if (!start.body) return undefined;
    // A body without a rollout goes to any worker, which answers the typed refusal.
    rollout = rolloutOfRunBody(start.body);
  }
  return rollout === undefined ? roundRobin() % workers : ownerOf(rollout, workers);
}
