// The one place an error code, its HTTP status and whether it is retryable are defined
// (control-plane.md §7).
// A refusal is data: a stable `code`, free `detail`, and the status the code implies.

/**
 * Every code: its HTTP status, and whether the same request may succeed when sent again (a busy
 * or unreachable peer, a checkpoint in the way) or never will (the request itself is wrong).
 */
export const ERRORS = {
  unauthorized: { status: 401, retryable: false },
  stale_checkpoint: { status: 409, retryable: false },
  checkpoint_conflict: { status: 409, retryable: false },
  invalid_phase: { status: 409, retryable: false },
  deadline_exceeded: { status: 409, retryable: true },
  restart_in_scope: { status: 409, retryable: false },
  export_failed: { status: 409, retryable: false },
  invalid_checkpoint_state: { status: 422, retryable: false },
  stale_attempt: { status: 409, retryable: false },
  admission_closed: { status: 409, retryable: true },
  rollout_id_required: { status: 400, retryable: false },
  invalid_rollout_id: { status: 400, retryable: false },
  activation_out_of_order: { status: 409, retryable: false },
  retire_incomplete: { status: 409, retryable: false },
  checkpoint_error: { status: 409, retryable: false },
  checkpoint_coordinator_unavailable: { status: 503, retryable: true },
  // Ours: a caller expected another process instance (the server restarted fresh since).
  instance_mismatch: { status: 409, retryable: false },
  // Not Gym codes: data-plane input that fails its schema, and an unknown route.
  invalid_request: { status: 400, retryable: false },
  not_found: { status: 404, retryable: false },
  // The policy model server's backend (servers/model/backend.ts): no answer, a reset or a 5xx; no
  // answer in time; a 4xx, which is the caller's error (sent with the backend's own status).
  backend_unavailable: { status: 502, retryable: true },
  backend_timeout: { status: 504, retryable: true },
  backend_rejected: { status: 400, retryable: false },
  // Data-plane refusals of single server kinds (participants.md §4.10 for the cohorts). A member of a
  // superseded cohort that was already waiting is released with 503 instead (genrm-cohorts.ts).
  invalid_cohort_coordinates: { status: 422, retryable: false },
  cohort_superseded: { status: 409, retryable: false },
  cohort_slot_conflict: { status: 409, retryable: false },
  cohort_prompt_mismatch: { status: 409, retryable: false },
  cohort_not_collected: { status: 503, retryable: true },
  // The agent's model or tool peer failed (servers/agent/peers.ts); the inference server is closing.
  model_error: { status: 502, retryable: true },
  tool_error: { status: 502, retryable: true },
  shutting_down: { status: 503, retryable: true },
} as const satisfies Record<string, { status: number; retryable: boolean }>;

export type ErrorCode = keyof typeof ERRORS;

export const ERROR_STATUS = Object.fromEntries(Object.entries(ERRORS).map(([code, e]) => [code, e.status])) as {
  [C in ErrorCode]: (typeof ERRORS)[C]['status'];
};

export const ERROR_CODES = Object.keys(ERRORS) as ErrorCode[];

/** The codes a retry of the same request cannot fix (the activity and workflow lists derive from these). */
export const NON_RETRYABLE_CODES: readonly ErrorCode[] = ERROR_CODES.filter((code) => !ERRORS[code].retryable);

/** A code of the table that a retry cannot fix; an unknown code is not one (a newer peer's code may be retried). */
export function isNonRetryableCode(code: string): code is ErrorCode {
  return Object.hasOwn(ERRORS, code) && !ERRORS[code as ErrorCode].retryable;
}

export interface ErrorEnvelope {
  error: { code: string; detail: string };
}

/** A typed refusal. Thrown anywhere; the HTTP layer turns it into the envelope and status. */
export class ProtocolError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly detail: string;

  constructor(code: ErrorCode, detail: string, status?: number) {
    super(`${code}: ${detail}`);
    this.name = 'ProtocolError';
    this.code = code;
    this.detail = detail;
    this.status = status ?? ERROR_STATUS[code];
  }

  toEnvelope(): ErrorEnvelope {
    return { error: { code: this.code, detail: this.detail } };
  }
}

export function isProtocolError(err: unknown): err is ProtocolError {
  return err instanceof ProtocolError;
}

/** Shorthand used at raise sites: `throw refuse('stale_attempt', ...)`. */
export function refuse(code: ErrorCode, detail: string): ProtocolError {
  return new ProtocolError(code, detail);
}

/** Reads `error.code` from any reply body; tolerates bodies without the envelope (§7.3). */
export function errorCodeOf(body: unknown): string | undefined {
  if (body && typeof body === 'object' && 'error' in body) {
    const e = (body as { error: unknown }).error;
    if (e && typeof e === 'object' && typeof (e as { code?: unknown }).code === 'string') {
      return (e as { code: string }).code;
    }
  }
  return undefined;
}
