// The agent sessions table (participants.md §3.2, §3.5): one entry per seeded agent session,
// owned by one attempt, plus the close receipts kept for the retry window.
import type { CaptureKey, EpisodeId } from '../../protocol/ids.js';
import { captureKey } from '../../protocol/ids.js';
import type { BoundarySnapshot, LoopState } from './loop-state.js';
import type { CloseReply, CompletedReply, DirectHttpGrant, Observations, SeedRequest } from './wire.js';

/** `idle` → `running` → `at_boundary` (parked, or awaiting a model call made right after one) → … → `idle`. */
export type SessionState = 'idle' | 'running' | 'at_boundary';

/** The activation a session is running. */
export interface RunningActivation {
  index: number;
  invocationId: string;
  controller: AbortController;
  /** Cancelled once, by a close or a retire (whichever came first). */
  cancelled: boolean;
  /** The reply (or the failure) the activation ends with; duplicates await it. */
  result: Promise<CompletedReply>;
  /** Settles (never rejects) once the activation has stopped. */
  stopped: Promise<void>;
}

export interface AgentSession {
  key: string;
  /** The attempt that owns it; null only with checkpointing off and no identity. */
  episode: EpisodeId | null;
  request: SeedRequest;
  grant: DirectHttpGrant | null;
  /** The grant's cookies as tool calls updated them; null without a direct HTTP grant. */
  resourcesCookies: Record<string, string> | null;
  observations: Observations | null;
  /** Started activations (the last index). */
  activations: number;
  completedActivation: number;
  completedReply: CompletedReply | null;
  state: SessionState;
  /** Latest boundary of the running activation; null when idle. */
  boundary: BoundarySnapshot | null;
  /** A restored boundary the next activation continues from. */
  continuation: LoopState | null;
  /** Installed by a restore and not yet claimed by an activation or a replayed reply. */
  restoredPending: boolean;
  running: RunningActivation | undefined;
  retiring: boolean;
  closing: boolean;
  closeTask: Promise<CloseReply> | undefined;
}

export function newSession(init: { key: string; episode: EpisodeId | null; request: SeedRequest; grant: DirectHttpGrant | null }): AgentSession {
  // Fields listed, not spread: V8 builds a spread followed by more fields slowly, and a restore
  // builds one session per record (measured in the restore profiles of `npm run bench -- scale --profile`).
  return {
    key: init.key,
    episode: init.episode,
    request: init.request,
    grant: init.grant,
    resourcesCookies: init.grant ? { ...init.grant.cookies } : null,
    observations: null,
    activations: 0,
    completedActivation: 0,
    completedReply: null,
    state: 'idle',
    boundary: null,
    continuation: null,
    restoredPending: false,
    running: undefined,
    retiring: false,
    closing: false,
    closeTask: undefined,
  };
}

export function sessionCaptureKey(s: AgentSession): CaptureKey | undefined {
  return s.episode ? captureKey(s.episode) : undefined;
}

/** True when retiring `target` covers this attempt (same rollout, attempt ≤ target's). */
export function covers(target: EpisodeId, e: EpisodeId | null): boolean {
  return e !== null && e.rollout_id === target.rollout_id && e.attempt <= target.attempt;
}

interface Receipt {
  reply: CloseReply;
  episode: EpisodeId | null;
  expiresAt: number;
}

export class SessionTable {
  private readonly sessions = new Map<string, AgentSession>();
  private readonly receipts = new Map<string, Receipt>();

  constructor(private readonly receiptWindowMs: number) {}

  get size(): number {
    return this.sessions.size;
  }

  get(key: string): AgentSession | undefined {
    return this.sessions.get(key);
  }

  add(s: AgentSession): void {
    this.sessions.set(s.key, s);
  }

  /**
   * Installs a restored session. It supersedes a close receipt of an earlier attempt under the
   * same key: in an agent that outlived the crash, the dead attempt may have closed it (chaos seed
   * 701: the replacement's own close was then refused as stale and its cohort never verified).
   */
  addRestored(s: AgentSession): void {
    this.receipts.delete(s.key);
    this.sessions.set(s.key, s);
  }

  /** Removes this very session (not a newer one registered under the same key). */
  remove(s: AgentSession): void {
    if (this.sessions.get(s.key) === s) this.sessions.delete(s.key);
  }

  values(): IterableIterator<AgentSession> {
    return this.sessions.values();
  }

  covered(targets: readonly EpisodeId[]): AgentSession[] {
    return [...this.sessions.values()].filter((s) => targets.some((t) => covers(t, s.episode)));
  }

  // --- close receipts ----------------------------------------------------------------------

  receipt(key: string): Receipt | undefined {
    this.pruneReceipts();
    return this.receipts.get(key);
  }

  keepReceipt(key: string, reply: CloseReply, episode: EpisodeId | null): void {
    this.pruneReceipts();
    this.receipts.delete(key);
    this.receipts.set(key, { reply, episode, expiresAt: Date.now() + this.receiptWindowMs });
  }

  private pruneReceipts(): void {
    // Insertion order is expiry order (one window for all), so stop at the first live receipt.
    const now = Date.now();
    for (const [k, r] of this.receipts) {
      if (r.expiresAt > now) break;
      this.receipts.delete(k);
    }
  }
}
