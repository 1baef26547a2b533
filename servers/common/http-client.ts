// Data-plane HTTP between Gym servers: two undici pools for data calls (control calls have their
// own, activities/control-client.ts), no 300 s body/header timeouts (a call parked during a
// checkpoint may wait long), JSON in and out, cookies as name → value maps, and the
// `/ng-rollout/<capture key>` prefix added for calls made inside an episode.
import { Agent, request } from 'undici';
import { rolloutPath, type CaptureKey } from '../../protocol/ids.js';
import { CLIENT_KEEP_ALIVE } from '../../protocol/keep-alive.js';
import { cookieHeader, parseSetCookies } from './session-cookie.js';

let dataPool: Agent | undefined;
let shortCallPool: Agent | undefined;

/**
 * Connections per server origin for calls no Gym gate holds across a checkpoint. Every
 * connection to one server takes a local port of the ~28,000 the kernel has for each destination
 * (and keeps it 60 s in TIME_WAIT after it closes): at 16,000 episodes the burst of `/verify` and
 * `/close_session` calls after a release opened a connection each, and with the tool calls and
 * seeds before it ran out of ports (`connect EADDRNOTAVAIL`, docs/performance.md). Past this cap
 * a call waits for a free connection in this process.
 */
export const SHORT_CALL_CONNECTIONS = 256;

/** The pool of held calls: no per-origin cap, thousands of episodes may each hold a parked call to one server. */
export function dataAgent(): Agent {
  dataPool ??= new Agent({ headersTimeout: 0, bodyTimeout: 0, ...CLIENT_KEEP_ALIVE });
  return dataPool;
}

/** The pool of short calls: at most {@link SHORT_CALL_CONNECTIONS} connections per origin. */
export function shortCallAgent(): Agent {
  shortCallPool ??= new Agent({ headersTimeout: 0, bodyTimeout: 0, connections: SHORT_CALL_CONNECTIONS, ...CLIENT_KEEP_ALIVE });
  return shortCallPool;
}

export async function closeDataAgent(): Promise<void> {
  const pools = [dataPool, shortCallPool];
  dataPool = undefined;
  shortCallPool = undefined;
  await Promise.all(pools.map((p) => p?.close()));
}

export interface JsonCallOptions {
  /** Prefix the path with `/ng-rollout/<key>` (calls made inside an episode). */
  rollout?: CaptureKey;
  cookies?: Record<string, string> | null;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  method?: 'POST' | 'GET';
  /**
   * A Gym gate may hold the call until a checkpoint ends (a model call, an activation that makes
   * one, a seed): it gets a connection of its own. A short call queued behind held ones could
   * keep a checkpoint's prepare waiting on the very calls it holds.
   */
  held?: boolean;
}

export interface JsonReply<T = unknown> {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: T;
  /** Cookies the reply set. */
  cookies: Record<string, string>;
}

/** Joins a base URL (which may itself end with `/ng-rollout/<key>`) and a path. */
export function joinPath(base: string, path: string): string {
  return `${base.replace(/\/+$/, '')}${path.startsWith('/') ? path : `/${path}`}`;
}

export async function callJson<T = unknown>(baseUrl: string, path: string, body: unknown, opts: JsonCallOptions = {}): Promise<JsonReply<T>> {
  const routed = opts.rollout !== undefined && !path.startsWith('/ng-rollout/') ? rolloutPath(opts.rollout, path) : path;
  const headers: Record<string, string> = { ...(opts.headers ?? {}) };
  const cookie = cookieHeader(opts.cookies);
  if (cookie) headers.cookie = cookie;
  const method = opts.method ?? 'POST';
  if (method === 'POST') headers['content-type'] = 'application/json';
  const res = await request(joinPath(baseUrl, routed), {
    method,
    headers,
    body: method === 'POST' ? JSON.stringify(body ?? {}) : undefined,
    signal: opts.signal,
    dispatcher: opts.held ? dataAgent() : shortCallAgent(),
  });
  const text = await res.body.text();
  let parsed: unknown = text;
  if (text.length) {
    try {
      parsed = JSON.parse(text);
    } catch {
      /* not JSON: keep the text */
    }
  }
  return { status: res.statusCode, headers: res.headers, body: parsed as T, cookies: parseSetCookies(res.headers['set-cookie']) };
}

/** An HTTP error from a peer, keeping its status and envelope code for the caller's decisions. */
export class PeerHttpError extends Error {
  constructor(
    readonly url: string,
    readonly status: number,
    readonly body: unknown,
  ) {
    super(`${url} answered HTTP ${status}: ${typeof body === 'string' ? body.slice(0, 300) : JSON.stringify(body).slice(0, 300)}`);
    this.name = 'PeerHttpError';
  }

  get code(): string | undefined {
    const b = this.body as { error?: { code?: unknown } } | undefined;
    return typeof b?.error?.code === 'string' ? b.error.code : undefined;
  }
}

/** callJson that throws PeerHttpError on any non-2xx reply. */
export async function callJsonOk<T = unknown>(baseUrl: string, path: string, body: unknown, opts: JsonCallOptions = {}): Promise<JsonReply<T>> {
  const r = await callJson<T>(baseUrl, path, body, opts);
  if (r.status < 200 || r.status >= 300) throw new PeerHttpError(joinPath(baseUrl, path), r.status, r.body);
  return r;
}
