// HTTP client for control-plane calls (control-plane.md §3, §11.2, §11.9).
// Control traffic gets its own undici Agent: data calls parked during a checkpoint can hold
// every connection to a host, and must not starve prepare, commit or resume.
import { Agent, type Dispatcher, request } from 'undici';
import { CLIENT_KEEP_ALIVE } from '../protocol/keep-alive.js';
import { traceHeaders } from '../servers/common/tracing.js';

export interface ControlPoolOptions {
  /** Connections per origin (reference knob `global_aiohttp_control_connector_limit_per_host`). */
  connections?: number;
  /** Bound on establishing one TCP connection. */
  connectTimeoutMs?: number;
}

export const DEFAULT_CONTROL_CONNECTIONS = 8;
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
/** Slack added to the remaining deadline: the participant bounds its work by the deadline, this covers the reply in flight. */
export const REPLY_SLACK_MS = 5_000;

/** The reserved control pool (§11.9); the worker makes one and passes it in (createActivities). */
export function createControlPool(opts: ControlPoolOptions = {}): Agent {
  return new Agent({
    connections: opts.connections ?? DEFAULT_CONTROL_CONNECTIONS,
    connect: { timeout: opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS },
    // Per-call timeouts come from the deadline (callTimeoutMs); undici's own 300 s defaults
    // would cut a long prepare or commit short.
    headersTimeout: 0,
    bodyTimeout: 0,
    ...CLIENT_KEEP_ALIVE,
  });
}

/** `max(deadline_ts − now, 0) + 5 s`, in milliseconds (§11.2). `deadlineTs` is epoch seconds. */
export function callTimeoutMs(deadlineTs: number, nowMs: number = Date.now()): number {
  return Math.max(deadlineTs * 1000 - nowMs, 0) + REPLY_SLACK_MS;
}

/** Encodes a body once; pass the same Buffer to every participant of a fan-out. */
export function encodeBody(value: unknown): Buffer {
  return Buffer.from(JSON.stringify(value), 'utf8');
}

export type TransportReason = 'connect' | 'socket' | 'timeout' | 'aborted' | 'other';

// EADDRNOTAVAIL is not here: it is the caller running out of local ports (a burst of connections
// on one machine), which says nothing about the server.
const CONNECT_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT']);
const SOCKET_CODES = new Set(['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED', 'ETIMEDOUT']);

/** The call did not produce an HTTP reply. Plain data fields only, so it survives serialization. */
export class ControlTransportError extends Error {
  readonly reason: TransportReason;
  readonly url: string;
  readonly method: string;
  /** Node/undici error code when there was one (e.g. `ECONNREFUSED`). */
  readonly code: string | undefined;
  readonly timeoutMs: number | undefined;

  constructor(args: { reason: TransportReason; url: string; method: string; message: string; code?: string; timeoutMs?: number }) {
    super(args.message);
    this.name = 'ControlTransportError';
    this.reason = args.reason;
    this.url = args.url;
    this.method = args.method;
    this.code = args.code;
    this.timeoutMs = args.timeoutMs;
  }

  /** A failure to reach the server at all, or a connection that broke: retrying is safe for a probe. */
  get isConnectionError(): boolean {
    return this.reason === 'connect' || this.reason === 'socket';
  }

  toJSON(): Record<string, unknown> {
    return { name: this.name, message: this.message, reason: this.reason, url: this.url, method: this.method, code: this.code, timeoutMs: this.timeoutMs };
  }
}

export function isControlTransportError(err: unknown): err is ControlTransportError {
  return err instanceof ControlTransportError;
}

export interface ControlCallOptions {
  /** Server base URL, e.g. `http://127.0.0.1:8001` (a trailing slash or a base path is fine). */
  url: string;
  method: 'GET' | 'POST';
  /** Absolute path, e.g. `/ng-control/v1/checkpoint/prepare`. */
  path: string;
  token: string;
  /** Already encoded; never re-encoded here. */
  body?: Buffer | string;
  timeoutMs: number;
  signal?: AbortSignal;
  /** The reserved control pool (createControlPool). */
  dispatcher: Dispatcher;
}

export interface ControlResponse {
  status: number;
  /** Parsed JSON, or the raw text when the body is not JSON (e.g. a plain-text 500). */
  body: unknown;
}

export function joinUrl(base: string, path: string): string {
  return base.replace(/\/+$/, '') + (path.startsWith('/') ? path : `/${path}`);
}

function errorCode(err: unknown): string | undefined {
  const c = (err as { code?: unknown } | null)?.code;
  if (typeof c === 'string') return c;
  // Happy-eyeballs connects surface an AggregateError whose entries carry the codes.
  const inner = (err as { errors?: unknown[] } | null)?.errors;
  if (Array.isArray(inner))
    for (const e of inner) {
      const ic = (e as { code?: unknown } | null)?.code;
      if (typeof ic === 'string') return ic;
    }
  return undefined;
}

function reasonOf(code: string | undefined): TransportReason {
  if (code && CONNECT_CODES.has(code)) return 'connect';
  if (code && SOCKET_CODES.has(code)) return 'socket';
  return 'other';
}

export async function controlCall(opts: ControlCallOptions): Promise<ControlResponse> {
  const url = joinUrl(opts.url, opts.path);
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(
    () => {
      timedOut = true;
      controller.abort();
    },
    Math.max(0, opts.timeoutMs),
  );
  const onAbort = (): void => controller.abort();
  if (opts.signal?.aborted) controller.abort();
  else opts.signal?.addEventListener('abort', onAbort, { once: true });

  try {
    const res = await request(url, {
      method: opts.method,
      dispatcher: opts.dispatcher,
      // The activity's trace context: the participant's span is a child of the call's activity.
      headers: { 'content-type': 'application/json', authorization: `Bearer ${opts.token}`, ...traceHeaders() },
      body: opts.body ?? null,
      signal: controller.signal,
    });
    const text = await res.body.text();
    let body: unknown = text;
    if (text.length > 0) {
      try {
        body = JSON.parse(text);
      } catch {
        body = text;
      }
    }
    return { status: res.statusCode, body };
  } catch (err) {
    if (timedOut) {
      throw new ControlTransportError({
        reason: 'timeout',
        url,
        method: opts.method,
        message: `no reply within ${formatSeconds(opts.timeoutMs)} seconds`,
        timeoutMs: opts.timeoutMs,
      });
    }
    if (opts.signal?.aborted) {
      throw new ControlTransportError({ reason: 'aborted', url, method: opts.method, message: 'call aborted' });
    }
    const code = errorCode(err);
    const message = err instanceof Error ? err.message : String(err);
    throw new ControlTransportError({
      reason: reasonOf(code),
      url,
      method: opts.method,
      message: message || code || 'transport error',
      ...(code ? { code } : {}),
    });
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onAbort);
  }
}

/** `60000` → `60`, `250` → `0.25`. */
export function formatSeconds(ms: number): string {
  return String(Math.round(ms) / 1000);
}
