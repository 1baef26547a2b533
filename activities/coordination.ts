// The controller side of the checkpoint control plane (control-plane.md §11): discovery and the
// ordered fan-outs of prepare, commit, renew, resume, restore, retire and forget.
// Plain async functions over plain data: Temporal activities wrap them, so every result and
// error here is serializable.
import type { Dispatcher } from 'undici';
import type { z } from 'zod';
import {
  CONTROL_PREFIX,
  CommitReplySchema,
  ForgetReplySchema,
  PrepareReplySchema,
  RenewReplySchema,
  RestoreReplySchema,
  ResumeReplySchema,
  RetireReplySchema,
  StatusReplySchema,
  normalizeReport,
  type CommitReply,
  type ControlOperation,
  type PrepareReply,
  type RenewReply,
  type RestoreReply,
  type ResumeReply,
  type StatusReply,
} from '../protocol/control.js';
import { pause } from '../servers/common/async.js';
import { errorCodeOf, isNonRetryableCode, type ErrorCode } from '../protocol/errors.js';
import { KINDS, PREPARE_ORDER, RETIRE_GROUPS, captureKey, nextAttempt, parseCaptureKey, type CaptureKey, type EpisodeId, type Kind } from '../protocol/ids.js';
import { callTimeoutMs, controlCall, encodeBody, formatSeconds, isControlTransportError, type ControlResponse } from './control-client.js';

// --- participants (what discovery found: §11.1) ------------------------------------------

export interface Member {
  name: string;
  url: string;
  kind: Kind;
}

/** The participants a checkpoint coordinates, the bearer token of their control routes, and the reserved control pool (§11.9) that reaches them. */
export interface Participants {
  token: string;
  pool: Dispatcher;
  /** Sorted by (prepare stage of kind, name), as discover returns them. */
  members: Member[];
}

/** Optional hooks every operation accepts. */
export interface CallOptions {
  /** Aborts every call still in flight (e.g. Temporal activity cancellation). */
  signal?: AbortSignal;
  /** Where failures that are logged rather than raised go (restore cleanup). Default: console.warn. */
  log?: (message: string, fields: Record<string, unknown>) => void;
}

// --- errors ----------------------------------------------------------------------------

export interface ServerFailure {
  /** HTTP status when the server replied. */
  status?: number;
  /** `error.code` of the envelope, when the body had one. */
  code?: string;
  /** `error.detail`, or the start of a non-envelope body, or the transport message. */
  detail: string;
  /** `HTTP <status> <code> <detail>`, or the transport description. */
  description: string;
  /** No HTTP reply (connection refused or broken, timeout, abort). */
  transport?: true;
  /** The server could not be reached, or the connection broke (refused, reset): its process is down or restarting. */
  unreachable?: true;
  /** Nothing listens at the server's address (connection refused): its process is gone, not merely busy. */
  refused?: true;
  /** The client timeout of the call fired. */
  timeout?: true;
  /** The caller's signal aborted the call. */
  aborted?: true;
  /** A 200 whose body does not match the reply schema. */
  invalidReply?: true;
}

export class CoordinationError extends Error {
  /** The control operation (or `discover`). */
  readonly operation: ControlOperation | 'discover';
  /** Server name → what went wrong there. Empty for deployment-level failures (no model). */
  readonly failures: Record<string, ServerFailure>;

  constructor(operation: ControlOperation | 'discover', failures: Record<string, ServerFailure>, message?: string) {
    super(message ?? describeFailures(operation, failures));
    this.name = 'CoordinationError';
    this.operation = operation;
    this.failures = failures;
  }

  toJSON(): { name: string; message: string; operation: string; failures: Record<string, ServerFailure> } {
    return { name: this.name, message: this.message, operation: this.operation, failures: this.failures };
  }
}

export function isCoordinationError(err: unknown): err is CoordinationError {
  return err instanceof CoordinationError;
}

function describeFailures(operation: string, failures: Record<string, ServerFailure>): string {
  const parts = Object.keys(failures)
    .sort()
    .map((name) => `${name}: ${failures[name]!.description}`);
  return `${operation} failed on ${parts.length} server(s): ${parts.join('; ')}`;
}

/**
 * `transient`: no reply, a timeout, or a 5xx — retry the call.
 * `refusal`: a 4xx with a code the error table marks not retryable — the same call cannot succeed.
 * `retryable_refusal`: a 4xx with a retryable code (e.g. `deadline_exceeded`, which the spec says to retry)
 *   or one the table does not know.
 * `protocol_violation`: anything else (a 4xx without an envelope such as a 422 validation error,
 *   a 404 on a known participant, a 200 whose body fails the reply schema).
 */
export type FailureClass = 'transient' | 'refusal' | 'retryable_refusal' | 'protocol_violation';

export function failureClass(f: ServerFailure): FailureClass {
  if (f.transport || (f.status !== undefined && f.status >= 500)) return 'transient';
  if (f.status !== undefined && f.status >= 400 && f.status < 500 && f.code !== undefined) {
    return isNonRetryableCode(f.code) ? 'refusal' : 'retryable_refusal';
  }
  return 'protocol_violation';
}

/** True when the error has at least one failure and every failure is transient. */
export function isTransient(err: CoordinationError): boolean {
  const fs = Object.values(err.failures);
  return fs.length > 0 && fs.every((f) => failureClass(f) === 'transient');
}

/** The non-retryable refusal code of the first failing server (by name) that has one. */
export function refusalCode(err: CoordinationError): ErrorCode | undefined {
  for (const name of Object.keys(err.failures).sort()) {
    const f = err.failures[name]!;
    if (failureClass(f) === 'refusal') return f.code as ErrorCode;
  }
  return undefined;
}

// --- fan-out mechanics (§11.2) ------------------------------------------------------------

const MAX_DETAIL = 500;

function truncate(s: string): string {
  return s.length > MAX_DETAIL ? `${s.slice(0, MAX_DETAIL)}…` : s;
}

function httpFailure(res: ControlResponse): ServerFailure {
  const code = errorCodeOf(res.body);
  let detail: string;
  if (code !== undefined) {
    const d = (res.body as { error: { detail?: unknown } }).error.detail;
    detail = typeof d === 'string' ? d : JSON.stringify(d ?? '');
  } else {
    // Non-envelope bodies: a 422 validation `{"detail": [...]}`, a plain-text 500, a 404 page.
    detail = typeof res.body === 'string' ? res.body : JSON.stringify(res.body);
  }
  detail = truncate(detail);
  const description = ['HTTP', String(res.status), code, detail].filter((p) => p !== undefined && p !== '').join(' ');
  return { status: res.status, ...(code !== undefined ? { code } : {}), detail, description };
}

function transportFailure(err: unknown): ServerFailure {
  if (isControlTransportError(err)) {
    const description = err.reason === 'timeout' ? err.message : `transport error: ${err.message}`;
    return {
      detail: err.message,
      description,
      transport: true,
      ...(err.isConnectionError ? { unreachable: true as const } : {}),
      ...(err.code === 'ECONNREFUSED' ? { refused: true as const } : {}),
      ...(err.reason === 'timeout' ? { timeout: true as const } : {}),
      ...(err.reason === 'aborted' ? { aborted: true as const } : {}),
    };
  }
  const msg = err instanceof Error ? err.message : String(err);
  return { detail: msg, description: `transport error: ${msg}`, transport: true };
}

function invalidReply(error: z.ZodError): ServerFailure {
  const issues = error.issues.map((i) => `${i.path.join('.') || '(body)'}: ${i.message}`).join(', ');
  const detail = truncate(`invalid reply: ${issues}`);
  return { status: 200, detail, description: `HTTP 200 ${detail}`, invalidReply: true };
}

type Outcome<T> = { ok: true; reply: T } | { ok: false; failure: ServerFailure };

interface Sent<T> {
  replies: Record<string, T>;
  failures: Record<string, ServerFailure>;
}

function opPath(op: ControlOperation): string {
  return `${CONTROL_PREFIX}/${op}`;
}

async function callOne<S extends z.ZodType, T>(
  member: { url: string },
  { token, pool }: { token: string; pool: Dispatcher },
  op: ControlOperation,
  body: Buffer | undefined,
  timeoutMs: number,
  schema: S,
  convert: (parsed: z.infer<S>) => T,
  signal: AbortSignal | undefined,
): Promise<Outcome<T>> {
  let res: ControlResponse;
  try {
    res = await controlCall({
      url: member.url,
      method: body === undefined ? 'GET' : 'POST',
      path: opPath(op),
      token,
      dispatcher: pool,
      ...(body !== undefined ? { body } : {}),
      timeoutMs,
      ...(signal ? { signal } : {}),
    });
  } catch (err) {
    return { ok: false, failure: transportFailure(err) };
  }
  if (res.status !== 200) return { ok: false, failure: httpFailure(res) };
  const parsed = schema.safeParse(res.body);
  if (!parsed.success) return { ok: false, failure: invalidReply(parsed.error) };
  return { ok: true, reply: convert(parsed.data) };
}

/** One concurrent fan-out of the same bytes to `members`; waits for every call. */
async function fanOut<S extends z.ZodType, T>(
  dep: Participants,
  members: readonly Member[],
  op: ControlOperation,
  body: Buffer,
  deadlineTs: number,
  schema: S,
  convert: (parsed: z.infer<S>) => T,
  signal: AbortSignal | undefined,
): Promise<Sent<T>> {
  const timeoutMs = callTimeoutMs(deadlineTs);
  const outcomes = await Promise.all(members.map((m) => callOne(m, dep, op, body, timeoutMs, schema, convert, signal)));
  const sent: Sent<T> = { replies: {}, failures: {} };
  members.forEach((m, i) => {
    const o = outcomes[i]!;
    if (o.ok) sent.replies[m.name] = o.reply;
    else sent.failures[m.name] = o.failure;
  });
  return sent;
}

function raiseIfFailed(op: ControlOperation, failures: Record<string, ServerFailure>): void {
  if (Object.keys(failures).length > 0) throw new CoordinationError(op, failures);
}

function checkDeadline(deadlineTs: number): void {
  if (!Number.isFinite(deadlineTs)) throw new TypeError(`deadline_ts must be a finite number, got ${deadlineTs}`);
}

/** Always `{rollout_id, attempt}`, nothing else (closed request models, §2.3). */
function wireEpisode(e: EpisodeId): { rollout_id: string; attempt: number } {
  return { rollout_id: e.rollout_id, attempt: e.attempt ?? 0 };
}

function membersOfKinds(dep: Participants, kinds: readonly Kind[]): Member[] {
  return dep.members.filter((m) => kinds.includes(m.kind));
}

const id = <T>(x: T): T => x;
const compareStrings = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

function defaultLog(message: string, fields: Record<string, unknown>): void {
  console.warn(`[coordination] ${message}`, JSON.stringify(fields));
}

// --- discovery (§11.1) ------------------------------------------------------------------

export interface DiscoverOptions {
  servers: { name: string; url: string }[];
  token: string;
  /** The reserved control pool (§11.9). */
  pool: Dispatcher;
  /** Bound on one status probe (one try). */
  probeTimeoutMs?: number;
  /** Tries in all for connection errors. */
  tries?: number;
  /** Backoff before try n+1 is `retryDelayMs * n`. */
  retryDelayMs?: number;
  requireModel?: boolean;
  signal?: AbortSignal;
}

export interface DiscoverResult {
  members: Member[];
  statuses: Record<string, StatusReply>;
  /** Servers that answered 404: not participants (judges, relays). */
  skipped: string[];
}

export const NO_MODEL_MESSAGE = 'no policy model takes part in checkpoints';

const KIND_SET = new Set<string>(KINDS);

type Probe = { kind: 'member'; status: StatusReply } | { kind: 'skipped' } | { kind: 'failed'; failure: ServerFailure };

async function probe(
  server: { url: string },
  { token, pool }: { token: string; pool: Dispatcher },
  probeTimeoutMs: number,
  tries: number,
  retryDelayMs: number,
  signal: AbortSignal | undefined,
): Promise<Probe> {
  for (let attempt = 1; ; attempt++) {
    let res: ControlResponse;
    try {
      res = await controlCall({
        url: server.url,
        method: 'GET',
        path: opPath('status'),
        token,
        dispatcher: pool,
        timeoutMs: probeTimeoutMs,
        ...(signal ? { signal } : {}),
      });
    } catch (err) {
      if (isControlTransportError(err) && err.reason === 'timeout') {
        const detail = `no status reply within ${formatSeconds(probeTimeoutMs)} seconds`;
        return { kind: 'failed', failure: { detail, description: detail, transport: true, timeout: true } };
      }
      if (isControlTransportError(err) && err.isConnectionError && attempt < tries && !signal?.aborted) {
        await pause(retryDelayMs * attempt, signal);
        continue;
      }
      const f = transportFailure(err);
      if (isControlTransportError(err) && err.isConnectionError) {
        f.detail = `${f.detail} (after ${attempt} tries)`;
        f.description = `${f.description} (after ${attempt} tries)`;
      }
      return { kind: 'failed', failure: f };
    }
    if (res.status === 404) return { kind: 'skipped' };
    if (res.status !== 200) return { kind: 'failed', failure: httpFailure(res) };
    const parsed = StatusReplySchema.safeParse(res.body);
    if (!parsed.success) return { kind: 'failed', failure: invalidReply(parsed.error) };
    if (!KIND_SET.has(parsed.data.kind)) {
      const detail = `unknown participant kind ${JSON.stringify(parsed.data.kind)}`;
      return { kind: 'failed', failure: { status: 200, detail, description: detail, invalidReply: true } };
    }
    const status = { ...parsed.data, report: normalizeReport(parsed.data.report) } as StatusReply;
    return { kind: 'member', status };
  }
}

export function sortMembers(members: readonly Member[]): Member[] {
  return [...members].sort((a, b) => PREPARE_ORDER.indexOf(a.kind) - PREPARE_ORDER.indexOf(b.kind) || compareStrings(a.name, b.name));
}

export async function discover(opts: DiscoverOptions): Promise<DiscoverResult> {
  const probeTimeoutMs = opts.probeTimeoutMs ?? 60_000;
  const tries = Math.max(1, opts.tries ?? 3);
  const retryDelayMs = opts.retryDelayMs ?? 250;
  const results = await Promise.all(opts.servers.map((s) => probe(s, opts, probeTimeoutMs, tries, retryDelayMs, opts.signal)));
  const members: Member[] = [];
  const statuses: Record<string, StatusReply> = {};
  const skipped: string[] = [];
  const failures: Record<string, ServerFailure> = {};
  opts.servers.forEach((s, i) => {
    const r = results[i]!;
    if (r.kind === 'skipped') skipped.push(s.name);
    else if (r.kind === 'failed') failures[s.name] = r.failure;
    else {
      members.push({ name: s.name, url: s.url, kind: r.status.kind });
      statuses[s.name] = r.status;
    }
  });
  if (Object.keys(failures).length > 0) throw new CoordinationError('discover', failures);
  if ((opts.requireModel ?? true) && !members.some((m) => m.kind === 'model')) {
    throw new CoordinationError('discover', {}, NO_MODEL_MESSAGE);
  }
  return { members: sortMembers(members), statuses, skipped };
}

// --- prepare (§11.3) ---------------------------------------------------------------------

export interface PrepareOptions extends CallOptions {
  checkpointId: string;
  deadlineTs: number;
}

/** Plain data: crosses a Temporal activity boundary as is. Read it with the functions below. */
export interface PrepareResult {
  checkpointId: string;
  /** True only if every stage prepared. */
  prepared: boolean;
  /** Server name → prepare reply, for every server contacted. */
  replies: Record<string, PrepareReply>;
  /** The kind of the first stage with an unprepared reply (absent when prepared). */
  stoppedAt?: Kind;
}

export async function prepare(dep: Participants, opts: PrepareOptions): Promise<PrepareResult> {
  checkDeadline(opts.deadlineTs);
  const result: PrepareResult = { checkpointId: opts.checkpointId, prepared: true, replies: {} };
  const restarts = new Set<CaptureKey>();
  for (const kind of PREPARE_ORDER) {
    const stage = membersOfKinds(dep, [kind]);
    if (stage.length === 0) continue;
    // Older participants reject the unknown field (closed models): send it only when non-empty.
    const body = encodeBody({
      checkpoint_id: opts.checkpointId,
      deadline_ts: opts.deadlineTs,
      ...(restarts.size > 0 ? { restarts: [...restarts].sort() } : {}),
    });
    const sent = await fanOut(
      dep,
      stage,
      'prepare',
      body,
      opts.deadlineTs,
      PrepareReplySchema,
      (r): PrepareReply => ({ phase: r.phase, report: normalizeReport(r.report) }),
      opts.signal,
    );
    raiseIfFailed('prepare', sent.failures);
    let stageReady = true;
    for (const m of stage) {
      const reply = sent.replies[m.name]!;
      result.replies[m.name] = reply;
      for (const k of reply.report.restarts) restarts.add(k);
      if (reply.phase !== 'prepared') stageReady = false;
    }
    if (!stageReady) {
      result.prepared = false;
      result.stoppedAt = kind;
      return result;
    }
  }
  return result;
}

/** Server name → `report.blockers`, for every reply whose phase is not `prepared`. */
export function preparedBlockers(result: PrepareResult): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [name, reply] of Object.entries(result.replies)) {
    if (reply.phase !== 'prepared') out[name] = reply.report.blockers;
  }
  return out;
}

/**
 * EpisodeIds decoded from every reply's `report.restarts`, de-duplicated, sorted by capture
 * key. A key that does not decode is skipped (it can name no episode we continue).
 */
export function preparedRestarts(result: PrepareResult): EpisodeId[] {
  const keys = new Set<CaptureKey>();
  for (const reply of Object.values(result.replies)) for (const k of reply.report.restarts) keys.add(k);
  const out: EpisodeId[] = [];
  for (const k of [...keys].sort()) {
    const e = parseCaptureKey(k);
    if (e) out.push(e);
  }
  return out;
}

/** The given episodes, in order, minus every one equal (same rollout and attempt) to a restart. This is the commit scope. */
export function continuedScope(result: PrepareResult, episodes: readonly EpisodeId[]): EpisodeId[] {
  const restartKeys = new Set(preparedRestarts(result).map(captureKey));
  return episodes.filter((e) => !restartKeys.has(captureKey(wireEpisode(e))));
}

// --- commit, renew (§11.5) ----------------------------------------------------------------

export interface CommitOptions extends CallOptions {
  checkpointId: string;
  deadlineTs: number;
  checkpointDir: string;
  /** Every episode the controller continues (already filtered through continuedScope); null = no scope. */
  scope: EpisodeId[] | null;
  /** Stop after this checkpoint instead of resuming; sent only when true. */
  stop?: boolean;
}

export async function commit(dep: Participants, opts: CommitOptions): Promise<Record<string, CommitReply>> {
  checkDeadline(opts.deadlineTs);
  const body = encodeBody({
    checkpoint_id: opts.checkpointId,
    deadline_ts: opts.deadlineTs,
    checkpoint_dir: opts.checkpointDir,
    // null is the default; omit it rather than send a value older layers might not know.
    ...(opts.scope !== null ? { episode_ids: opts.scope.map(wireEpisode) } : {}),
    ...(opts.stop === true ? { stop: true } : {}),
  });
  const sent = await fanOut(dep, dep.members, 'commit', body, opts.deadlineTs, CommitReplySchema, id, opts.signal);
  raiseIfFailed('commit', sent.failures);
  return sent.replies;
}

/** Sorted union of the environment servers' committed `episode_ids`: the episodes in the checkpoint (§11.5 step 2). */
export function committedEnvironmentKeys(dep: Participants, replies: Record<string, CommitReply>): CaptureKey[] {
  const keys = new Set<CaptureKey>();
  for (const m of membersOfKinds(dep, ['environment'])) {
    for (const k of replies[m.name]?.episode_ids ?? []) keys.add(k);
  }
  return [...keys].sort();
}

export interface CheckpointCallOptions extends CallOptions {
  checkpointId: string;
  deadlineTs: number;
}

export async function renew(dep: Participants, opts: CheckpointCallOptions): Promise<Record<string, RenewReply>> {
  checkDeadline(opts.deadlineTs);
  const body = encodeBody({ checkpoint_id: opts.checkpointId, deadline_ts: opts.deadlineTs });
  const sent = await fanOut(
    dep,
    dep.members,
    'renew',
    body,
    opts.deadlineTs,
    RenewReplySchema,
    (r): RenewReply => ({ lease_expires_at: r.lease_expires_at }),
    opts.signal,
  );
  raiseIfFailed('renew', sent.failures);
  return sent.replies;
}

// --- resume (§11.6) ----------------------------------------------------------------------

/** Reverse stage order; a failing stage does not stop the others; failures are raised together at the end. */
export async function resume(dep: Participants, opts: CheckpointCallOptions): Promise<Record<string, ResumeReply>> {
  checkDeadline(opts.deadlineTs);
  const body = encodeBody({ checkpoint_id: opts.checkpointId, deadline_ts: opts.deadlineTs });
  const replies: Record<string, ResumeReply> = {};
  const failures: Record<string, ServerFailure> = {};
  for (const kind of [...PREPARE_ORDER].reverse()) {
    const stage = membersOfKinds(dep, [kind]);
    if (stage.length === 0) continue;
    const sent = await fanOut(
      dep,
      stage,
      'resume',
      body,
      opts.deadlineTs,
      ResumeReplySchema,
      (r): ResumeReply => ({ phase: r.phase, idempotent: r.idempotent }),
      opts.signal,
    );
    Object.assign(replies, sent.replies);
    Object.assign(failures, sent.failures);
  }
  raiseIfFailed('resume', failures);
  return replies;
}

// --- restore (§11.7) ---------------------------------------------------------------------

export interface RestoreOptions extends CallOptions {
  /** The restore's own ID (not the source checkpoint's). */
  checkpointId: string;
  deadlineTs: number;
  checkpointDir: string;
  /** The checkpointed attempts N the controller continues. */
  scope: EpisodeId[];
}

export const RESTORE_CLEANUP_MIN_S = 30;

/**
 * All or nothing. On any failure: retire the replacements (N+1) everywhere and resume everyone
 * under the restore's ID (both logged, never raised), then raise the original restore error.
 */
export async function restore(dep: Participants, opts: RestoreOptions): Promise<Record<string, RestoreReply>> {
  checkDeadline(opts.deadlineTs);
  const log = opts.log ?? defaultLog;
  const body = encodeBody({
    checkpoint_id: opts.checkpointId,
    deadline_ts: opts.deadlineTs,
    checkpoint_dir: opts.checkpointDir,
    episode_ids: opts.scope.map(wireEpisode),
  });
  const sent = await fanOut(dep, dep.members, 'restore', body, opts.deadlineTs, RestoreReplySchema, id, opts.signal);
  if (Object.keys(sent.failures).length === 0) return sent.replies;

  const original = new CoordinationError('restore', sent.failures);
  const cleanupDeadline = Math.max(opts.deadlineTs, Date.now() / 1000 + RESTORE_CLEANUP_MIN_S);
  // The cleanup runs even when the caller's signal aborted the restore: a half-installed restore
  // must not keep admission closed until the leases run out.
  try {
    await retire(dep, {
      checkpointId: opts.checkpointId,
      deadlineTs: cleanupDeadline,
      episodes: opts.scope.map((e) => nextAttempt(wireEpisode(e))),
    });
  } catch (err) {
    log('retire of replacement attempts after a failed restore failed', { checkpointId: opts.checkpointId, error: errorFields(err) });
  }
  try {
    await resume(dep, { checkpointId: opts.checkpointId, deadlineTs: cleanupDeadline });
  } catch (err) {
    log('resume after a failed restore failed', { checkpointId: opts.checkpointId, error: errorFields(err) });
  }
  throw original;
}

function errorFields(err: unknown): unknown {
  if (isCoordinationError(err)) return err.toJSON();
  return err instanceof Error ? { name: err.name, message: err.message } : String(err);
}

// --- retire and forget (§11.8) --------------------------------------------------------------

/** Replies of either layer: Latest counts, Baseline lists (then the list is kept too). */
export interface RetireOutcome {
  retired_count: number;
  retired?: CaptureKey[];
}
export interface ForgetOutcome {
  forgotten_count: number;
  forgotten?: string[];
}

export interface RetireOptions extends CallOptions {
  /** Default `retire`; after a restore and before resume, the restore's ID. */
  checkpointId?: string;
  deadlineTs: number;
  /** Each retires that attempt and every earlier attempt of its rollout. */
  episodes: EpisodeId[];
}

export interface ForgetOptions extends CallOptions {
  /** Default `forget`. */
  checkpointId?: string;
  deadlineTs: number;
  rolloutIds: string[];
}

/** Groups in sequence (callers first), members of a group concurrently; a failing group aborts. */
async function inRetireOrder<S extends z.ZodType, T>(
  dep: Participants,
  op: 'retire' | 'forget',
  body: Buffer,
  deadlineTs: number,
  schema: S,
  convert: (parsed: z.infer<S>) => T,
  signal: AbortSignal | undefined,
): Promise<Record<string, T>> {
  const replies: Record<string, T> = {};
  for (const group of RETIRE_GROUPS) {
    const members = membersOfKinds(dep, group);
    if (members.length === 0) continue;
    const sent = await fanOut(dep, members, op, body, deadlineTs, schema, convert, signal);
    raiseIfFailed(op, sent.failures);
    Object.assign(replies, sent.replies);
  }
  return replies;
}

export async function retire(dep: Participants, opts: RetireOptions): Promise<Record<string, RetireOutcome>> {
  checkDeadline(opts.deadlineTs);
  if (opts.episodes.length === 0) return {};
  const body = encodeBody({
    checkpoint_id: opts.checkpointId ?? 'retire',
    deadline_ts: opts.deadlineTs,
    episode_ids: opts.episodes.map(wireEpisode),
  });
  return inRetireOrder(
    dep,
    'retire',
    body,
    opts.deadlineTs,
    RetireReplySchema,
    (r): RetireOutcome => {
      const o = r as { retired_count?: number; retired?: CaptureKey[] };
      return typeof o.retired_count === 'number' ? { retired_count: o.retired_count } : { retired_count: o.retired?.length ?? 0, retired: o.retired ?? [] };
    },
    opts.signal,
  );
}

export async function forget(dep: Participants, opts: ForgetOptions): Promise<Record<string, ForgetOutcome>> {
  checkDeadline(opts.deadlineTs);
  const rolloutIds = [...new Set(opts.rolloutIds)].sort(compareStrings);
  if (rolloutIds.length === 0) return {};
  const body = encodeBody({
    checkpoint_id: opts.checkpointId ?? 'forget',
    deadline_ts: opts.deadlineTs,
    rollout_ids: rolloutIds,
  });
  return inRetireOrder(
    dep,
    'forget',
    body,
    opts.deadlineTs,
    ForgetReplySchema,
    (r): ForgetOutcome => {
      const o = r as { forgotten_count?: number; forgotten?: string[] };
      return typeof o.forgotten_count === 'number'
        ? { forgotten_count: o.forgotten_count }
        : { forgotten_count: o.forgotten?.length ?? 0, forgotten: o.forgotten ?? [] };
    },
    opts.signal,
  );
}
