// The one participant a multi-worker server presents to the controller (docs/multi-worker.md). Each
// worker runs the ordinary control plane over the episodes it owns; the front fans every control
// call out to all of them, with the same body (or, for per-episode calls, each its own episodes),
// and answers once from their answers: one status, one phase, one instance identity, one
// manifest (storage/join.ts). A worker's refusal is the server's refusal.
import {
  CONTROL_PREFIX,
  scopeKey,
  type CheckpointRequest,
  type CommitReply,
  type CommitRequest,
  type ForgetReply,
  type ForgetRequest,
  type PrepareReply,
  type PrepareRequest,
  type RenewReply,
  type RestoreReply,
  type RestoreRequest,
  type ResumeReply,
  type RetireReply,
  type RetireRequest,
  type StatusReply,
} from '../../protocol/control.js';
import { ERROR_CODES, ProtocolError, errorCodeOf, refuse, type ErrorCode } from '../../protocol/errors.js';
import { Mutex } from '../common/async.js';
import { PLACE_PART_OPERATION, type ControlSurface } from '../control/plugin.js';
import { joinDirectory, joinWorkerRecords } from '../control/storage/join.js';
import { mergeExtras, mergeReports, mergeStatus, unionOfKeys } from './merge.js';
import { partition } from './owner.js';
import { ControlLink } from './control-link.js';

export interface CoordinatorOptions {
  kind: string;
  instance: string;
  /** The server's identity (its workers take it too): a worker that dies takes the whole server with it, so a new front is a new instance. */
  instanceId: string;
  token: string;
  /** The workers' Unix sockets, in worker order. */
  sockets: readonly string[];
}

interface JoinState {
  id: string;
  dir: string;
  scopeKey: string;
  stopped: boolean;
  task: Promise<CommitReply>;
}

export class WorkerCoordinator implements ControlSurface {
  readonly instanceId: string;
  private readonly links: ControlLink[];
  /** The one join per checkpoint ID (a retried commit awaits it); resume stops it before its manifest. */
  private join: JoinState | undefined;
  private readonly joinLock = new Mutex();

  constructor(private readonly opts: CoordinatorOptions) {
    this.instanceId = opts.instanceId;
    this.links = opts.sockets.map((socket) => new ControlLink(socket));
  }

  async close(): Promise<void> {
    await Promise.all(this.links.map((l) => l.close()));
  }

  async status(): Promise<StatusReply> {
    const statuses = await this.all<StatusReply>('GET', 'status');
    return { ...mergeStatus(statuses, this.instanceId), expected_workers: this.links.length };
  }

  async prepare(req: PrepareRequest): Promise<PrepareReply> {
    const replies = await this.all<PrepareReply>('POST', 'prepare', req);
    return { phase: replies[0]!.phase, report: mergeReports(replies.map((r) => r.report)) };
  }

  async renew(req: CheckpointRequest): Promise<RenewReply> {
    const replies = await this.all<RenewReply>('POST', 'renew', req);
    return { lease_expires_at: Math.min(...replies.map((r) => r.lease_expires_at)) };
  }

  async commit(req: CommitRequest): Promise<CommitReply> {
    const key = scopeKey(req.episode_ids);
    const current = this.join;
    if (current && current.id === req.checkpoint_id && !current.stopped) {
      // As the control plane does (control-plane.ts handleCommit): a retry with the same
      // arguments awaits the same commit and extends the lease; other arguments are a conflict.
      if (current.dir !== req.checkpoint_dir || current.scopeKey !== key) {
        throw refuse('checkpoint_conflict', `checkpoint '${req.checkpoint_id}' was committed with another directory or scope`);
      }
      await this.renew({ checkpoint_id: req.checkpoint_id, deadline_ts: req.deadline_ts });
      return current.task;
    }
    const state = { id: req.checkpoint_id, dir: req.checkpoint_dir, scopeKey: key, stopped: false } as JoinState;
    state.task = this.runCommit(req, state);
    state.task.catch(() => {
      if (this.join === state) this.join = undefined;
    });
    this.join = state;
    return state.task;
  }

  private async runCommit(req: CommitRequest, state: JoinState): Promise<CommitReply> {
    // Each worker commits the scope episodes it owns (it holds no other episode's state, and what
    // it frees as left out of the scope is its own), and holds its records as a part in memory.
    // A null scope (every episode the participant holds) stays null for each.
    await joinDirectory(req.checkpoint_dir, this.opts.kind, this.opts.instance);
    const scopes = req.episode_ids && partition(req.episode_ids, (e) => e.rollout_id, this.links.length);
    const replies = await this.each<CommitReply>('POST', 'commit', (i) => ({ ...req, episode_ids: scopes ? scopes[i]! : null }));
    const extras = mergeExtras(replies.map(({ phase: _a, manifest: _b, episode_ids: _c, ...rest }) => rest));
    const manifest = await this.joinLock.run(() =>
      joinWorkerRecords({
        checkpointDir: req.checkpoint_dir,
        kind: this.opts.kind,
        instance: this.opts.instance,
        checkpointId: req.checkpoint_id,
        parts: replies.map((r) => r.manifest),
        place: async (i, file, offset) => {
          await this.call(i, 'POST', PLACE_PART_OPERATION, JSON.stringify({ checkpoint_id: req.checkpoint_id, file, offset }));
        },
        stopped: () => state.stopped,
      }),
    );
    return {
      ...extras,
      phase: 'committed',
      manifest,
      episode_ids: unionOfKeys(replies.map((r) => r.episode_ids)),
    };
  }

  async restore(req: RestoreRequest): Promise<RestoreReply> {
    // Each worker restores the episodes it will own, reading the server's one records file.
    const scopes = partition(req.episode_ids, (e) => e.rollout_id, this.links.length);
    const replies = await this.each<RestoreReply>('POST', 'restore', (i) => ({ ...req, episode_ids: scopes[i]! }));
    const extras = mergeExtras(replies.map(({ phase: _a, source_checkpoint_id: _b, restored: _c, ...rest }) => rest));
    return {
      ...extras,
      phase: 'restored',
      source_checkpoint_id: replies[0]!.source_checkpoint_id,
      restored: unionOfKeys(replies.map((r) => r.restored)),
    };
  }

  async resume(req: CheckpointRequest): Promise<ResumeReply> {
    const join = this.join;
    if (join?.id === req.checkpoint_id) {
      // Once this returns, the join of this checkpoint never publishes (§5.6: resume stops the write).
      await this.joinLock.run(() => void (join.stopped = true));
      this.join = undefined;
    }
    const replies = await this.all<ResumeReply>('POST', 'resume', req);
    return { phase: 'idle', idempotent: replies.every((r) => r.idempotent) };
  }

  async retire(req: RetireRequest): Promise<RetireReply> {
    const parts = partition(req.episode_ids, (e) => e.rollout_id, this.links.length);
    const replies = await this.some<RetireReply>(
      'retire',
      parts.map((episode_ids) => (episode_ids.length ? { ...req, episode_ids } : undefined)),
    );
    return { retired_count: replies.reduce((n, r) => n + r.retired_count, 0) };
  }

  async forget(req: ForgetRequest): Promise<ForgetReply> {
    const parts = partition(req.rollout_ids, (id) => id, this.links.length);
    const replies = await this.some<ForgetReply>(
      'forget',
      parts.map((rollout_ids) => (rollout_ids.length ? { ...req, rollout_ids } : undefined)),
    );
    return { forgotten_count: replies.reduce((n, r) => n + r.forgotten_count, 0) };
  }

  // --- fan-out ---------------------------------------------------------------------------

  /** The same bytes to every worker (encoded once). */
  private all<T>(method: 'GET' | 'POST', op: string, body?: unknown): Promise<T[]> {
    const bytes = body === undefined ? undefined : JSON.stringify(body);
    return settleAll(this.links.map((_, i) => this.call<T>(i, method, op, bytes)));
  }

  private each<T>(method: 'POST', op: string, bodyOf: (i: number) => unknown): Promise<T[]> {
    return settleAll(this.links.map((_, i) => this.call<T>(i, method, op, JSON.stringify(bodyOf(i)))));
  }

  /** Only the workers with a body (per-episode calls skip a worker that owns none of them). */
  private some<T>(op: string, bodies: ReadonlyArray<unknown | undefined>): Promise<T[]> {
    return settleAll(bodies.flatMap((body, i) => (body === undefined ? [] : [this.call<T>(i, 'POST', op, JSON.stringify(body))])));
  }

  private async call<T>(index: number, method: 'GET' | 'POST', op: string, body: string | undefined): Promise<T> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.opts.token}` };
    if (body !== undefined) headers['content-type'] = 'application/json';
    let res: { status: number; text: string };
    try {
      res = await this.links[index]!.call(method, `${CONTROL_PREFIX}/${op}`, headers, body);
    } catch (err) {
      throw refuse('checkpoint_coordinator_unavailable', `worker ${index} did not answer ${op}: ${(err as Error).message}`);
    }
    const text = res.text;
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    if (res.status >= 200 && res.status < 300) return parsed as T;
    const code = errorCodeOf(parsed);
    const detail = (parsed as { error?: { detail?: unknown } } | undefined)?.error?.detail;
    if (code && isErrorCode(code)) throw new ProtocolError(code, `worker ${index}: ${typeof detail === 'string' ? detail : text}`, res.status);
    // Not a known refusal (a validation reply, a crash): relayed as the protocol says for multi-worker servers.
    throw new ProtocolError('checkpoint_error', `worker ${index} answered ${op} with HTTP ${res.status}: ${text.slice(0, 500)}`, 500);
  }
}

/** Every call settles before the answer (none left running behind it); the first refusal in worker order wins. */
async function settleAll<T>(calls: Array<Promise<T>>): Promise<T[]> {
  const settled = await Promise.allSettled(calls);
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed) throw failed.reason;
  return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
}

function isErrorCode(code: string): code is ErrorCode {
  return (ERROR_CODES as readonly string[]).includes(code);
}
