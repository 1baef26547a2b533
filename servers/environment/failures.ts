// Handled `/run` failures (participants.md §2.3): a failure that belongs in the episode reply (HTTP
// 200, `failure` set) rather than an HTTP error, and whether it is worth retrying (`terminal`).
import { PeerHttpError } from '../common/http-client.js';
import type { FailureStage, RunFailure } from '../../protocol/tasks.js';

export const FAILURE_REASON_MAX = 2000;

export class HandledFailure extends Error {
  readonly failure: RunFailure;

  constructor(failure: { failure_reason: string; terminal: boolean; stage?: FailureStage; partial_response?: unknown }) {
    super(failure.failure_reason);
    this.name = 'HandledFailure';
    this.failure = { ...failure, failure_reason: failure.failure_reason.slice(0, FAILURE_REASON_MAX) };
  }
}

/** The episode deadline (`default_episode_timeout_seconds`) ran out. */
export class EpisodeTimedOut extends Error {
  constructor() {
    super('Episode timed out');
    this.name = 'EpisodeTimedOut';
  }
}

/** A reply from a peer that is not what the protocol requires (never worth a retry). */
export class ProtocolViolation extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ProtocolViolation';
  }
}

const RETRYABLE_STATUS = new Set([408, 425, 429]);
// Connection, socket, payload and timeout errors of undici and node:net.
const RETRYABLE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_RES_CONTENT_LENGTH_MISMATCH',
  'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH',
  // A connection this process could not open for want of descriptors or ports: local and
  // passing (seen at 8,000 episodes in one process), not the episode's fault.
  'EMFILE',
  'ENFILE',
  'EADDRNOTAVAIL',
]);

/** `terminal: false` for HTTP 408/425/429/≥500, connection, payload and timeout errors. */
export function isRetryableDependencyError(err: unknown): boolean {
  if (err instanceof PeerHttpError) return RETRYABLE_STATUS.has(err.status) || err.status >= 500;
  for (let e: unknown = err, depth = 0; e && typeof e === 'object' && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && RETRYABLE_CODES.has(code)) return true;
    const name = (e as { name?: unknown }).name;
    if (name === 'TimeoutError') return true;
  }
  return false;
}

/** Wraps a dependency error of one stage as a handled failure. */
export function stageFailure(stage: FailureStage, err: unknown, partialResponse?: unknown): HandledFailure {
  if (err instanceof HandledFailure) return err;
  return new HandledFailure({
    failure_reason: describe(err),
    terminal: !isRetryableDependencyError(err),
    stage,
    ...(partialResponse !== undefined ? { partial_response: partialResponse } : {}),
  });
}

export function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
