// The one place an error code and its HTTP status are defined (control-plane.md §7).
// A refusal is data: a stable `code`, free `detail`, and the status the code implies.

export const ERROR_STATUS = {
  unauthorized: 401,
  stale_checkpoint: 409,
  checkpoint_conflict: 409,
  invalid_phase: 409,
  deadline_exceeded: 409,
  restart_in_scope: 409,
  export_failed: 409,
  invalid_checkpoint_state: 422,
  stale_attempt: 409,
  admission_closed: 409,
  rollout_id_required: 400,
  invalid_rollout_id: 400,
  activation_out_of_order: 409,
  retire_incomplete: 409,
  checkpoint_error: 409,
  checkpoint_coordinator_unavailable: 503,
  // Ours: a caller expected another process instance (the server restarted fresh since).
  instance_mismatch: 409,
  // Not Gym codes: data-plane input that fails its schema, and an unknown route.
  invalid_request: 400,
  not_found: 404,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;

export const ERROR_CODES = Object.keys(ERROR_STATUS) as ErrorCode[];

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
