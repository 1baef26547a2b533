// A handed-off connection kept alive (docs/multi-worker.md). The front routed its first request;
// the caller may send more on it, and every one whose rollout this worker owns is served here
// without going through the front again. Between servers with the same number of workers that is
// every request: a worker's episodes are owned by the same worker index everywhere (owner.ts). A
// request this worker does not own (a caller with another number of workers, or one process) is
// relayed to its owner over the owner's socket, and the connection then closes, so the caller's
// next request goes through the front. A `/run` closes its connection too: its rollout is in its
// body, which only the front reads before choosing a worker. A request for one of the front's own
// routes (a control call, `/metrics`) is relayed to the front, so it reaches the server's one
// participant and not this worker's part of it, and the connection then closes too.
import type { IncomingHttpHeaders, IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Pool } from 'undici';
import { isFrontRoute } from './front-routes.js';
import { isRunRequest, ownerOf, rolloutOfUrl } from './owner.js';
import { isHopByHop } from '../common/hop-by-hop.js';

export interface KeptConnectionOptions {
  index: number;
  workers: number;
  /** The Unix socket of worker `j` (relays go there). */
  socketOf: (j: number) => string;
  /** The server's URL: the front, for its own routes. */
  frontUrl: string;
}

/**
 * Serves the requests of handed-off connections (`handedOff`) on `server`: its own ones through the
 * app, the others relayed to their owner. Replaces the app's 'request' listeners with one that
 * decides first.
 */
export function serveKeptConnections(server: Server, handedOff: WeakSet<Socket>, o: KeptConnectionOptions): void {
  const app = server.listeners('request') as Array<(req: IncomingMessage, res: ServerResponse) => void>;
  server.removeAllListeners('request');
  const pools = new Map<number, Pool>();
  const poolOf = (j: number): Pool => {
    let pool = pools.get(j);
    if (!pool) pools.set(j, (pool = new Pool('http://worker', { socketPath: o.socketOf(j), headersTimeout: 0, bodyTimeout: 0 })));
    return pool;
  };
  let front: Pool | undefined;
  server.on('close', () => {
    for (const p of pools.values()) void p.close();
    void front?.close();
  });
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    if (handedOff.has(req.socket as Socket)) {
      const url = req.url ?? '/';
      if (isFrontRoute(url)) {
        res.shouldKeepAlive = false;
        front ??= new Pool(o.frontUrl, { headersTimeout: 0, bodyTimeout: 0 });
        relay(req, res, front);
        return;
      }
      const rollout = rolloutOfUrl(url);
      const owner = rollout === undefined ? o.index : ownerOf(rollout, o.workers);
      if (owner !== o.index) {
        res.shouldKeepAlive = false;
        relay(req, res, poolOf(owner));
        return;
      }
      if (isRunRequest(req.method, url)) res.setHeader('connection', 'close');
    }
    for (const listener of app) listener.call(server, req, res);
  });
}

function relay(req: IncomingMessage, res: ServerResponse, pool: Pool): void {
  const abort = new AbortController();
  // A caller that goes away cancels the call at the owner too.
  res.once('close', () => {
    if (!res.writableEnded) abort.abort();
  });
  const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
  pool.request({ method: req.method as 'GET', path: req.url ?? '/', headers: relayed(req.headers), body: hasBody ? req : null, signal: abort.signal }).then(
    (upstream) => {
      res.writeHead(upstream.statusCode, relayed(upstream.headers as IncomingHttpHeaders));
      upstream.body.on('error', () => res.destroy());
      upstream.body.pipe(res);
    },
    () => {
      // No answer from the owner (it withheld one, or it is gone): none for the caller either.
      res.destroy();
    },
  );
}

function relayed(headers: IncomingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !isHopByHop(k)) out[k] = v;
  return out;
}
