// Our idempotent `/run` extension (design.md "Decisions", docs/gym-servers.md): Temporal activities
// run at least once, so a `/run` of an attempt that is still running joins that run and gets the
// same reply, and a `/run` of an attempt that already finished gets the kept reply until the
// controller forgets its rollout. One attempt is never executed twice.
//
// Memory: replies are kept per capture key until `forget` of the rollout. At most `maxKept` are
// held (oldest evicted first, with a warning); an evicted attempt leaves a tombstone (its key only)
// so a late duplicate is refused with `checkpoint_error` rather than run a second time. Tombstones
// are dropped by `forget` and capped at `maxTombstones` (oldest first) for deployments without
// checkpointing, where no `forget` ever comes.
import type { ProtocolError } from '../../protocol/errors.js';
import { parseCaptureKey, type CaptureKey } from '../../protocol/ids.js';

/** What `/run` answers: an HTTP status and its JSON body, or a typed refusal (sent as one, so counted). */
export type RunOutcome = { status: number; body: unknown } | { refusal: ProtocolError };

export interface FinishedRun {
  outcome: RunOutcome;
  /**
   * Keep it for duplicates: true for runs that actually began (a handled failure included); false
   * for refusals and runs that never began (a retried `/run` must be able to run after them).
   */
  keep: boolean;
}

export type AttemptLookup =
  | { kind: 'running'; digest: string; reply: Promise<RunOutcome> }
  | { kind: 'kept'; digest: string; reply: RunOutcome }
  | { kind: 'evicted' };

interface Entry {
  digest: string;
  running: Promise<RunOutcome> | undefined;
  kept: RunOutcome | undefined;
}

export interface AttemptRepliesOptions {
  maxKept?: number;
  maxTombstones?: number;
  onEvict?: (key: CaptureKey) => void;
}

export class AttemptReplies {
  private readonly entries = new Map<CaptureKey, Entry>();
  /** Finished entries in the order they finished (eviction order). */
  private readonly keptOrder = new Set<CaptureKey>();
  private readonly tombstones = new Set<CaptureKey>();
  private readonly byRollout = new Map<string, Set<CaptureKey>>();
  private readonly maxKept: number;
  private readonly maxTombstones: number;
  private readonly onEvict: (key: CaptureKey) => void;

  constructor(opts: AttemptRepliesOptions = {}) {
    this.maxKept = opts.maxKept ?? 10_000;
    this.maxTombstones = opts.maxTombstones ?? 1_000_000;
    this.onEvict = opts.onEvict ?? (() => undefined);
  }

  get runningCount(): number {
    return this.entries.size - this.keptOrder.size;
  }

  get keptCount(): number {
    return this.keptOrder.size;
  }

  lookup(key: CaptureKey): AttemptLookup | undefined {
    const e = this.entries.get(key);
    if (e?.running) return { kind: 'running', digest: e.digest, reply: e.running };
    if (e?.kept) return { kind: 'kept', digest: e.digest, reply: e.kept };
    return this.tombstones.has(key) ? { kind: 'evicted' } : undefined;
  }

  /**
   * Starts the one execution of this attempt. The caller must have checked `lookup` first in the
   * same tick (no await in between), so no second execution can start.
   */
  start(key: CaptureKey, digest: string, work: () => Promise<FinishedRun>): Promise<RunOutcome> {
    if (this.entries.has(key)) throw new Error(`attempt ${key} already has a run`);
    const entry: Entry = { digest, running: undefined, kept: undefined };
    const running = work().then(
      (finished) => {
        this.finish(key, entry, finished);
        return finished.outcome;
      },
      (err: unknown) => {
        if (this.entries.get(key) === entry) this.remove(key);
        throw err;
      },
    );
    entry.running = running;
    this.entries.set(key, entry);
    this.index(key);
    return running;
  }

  /** Drops everything kept for this attempt (retired attempts are refused by their mark anyway). */
  drop(key: CaptureKey): void {
    if (this.entries.get(key)?.running) return;
    this.tombstones.delete(key);
    this.remove(key);
  }

  /** `forget`: the rollouts are finished for good; no duplicate of theirs can come any more. */
  forget(rolloutIds: Iterable<string>): void {
    for (const r of rolloutIds) {
      const keys = this.byRollout.get(r);
      if (!keys) continue;
      for (const k of [...keys]) this.drop(k);
    }
  }

  private finish(key: CaptureKey, entry: Entry, finished: FinishedRun): void {
    if (this.entries.get(key) !== entry) return;
    entry.running = undefined;
    if (!finished.keep) {
      this.remove(key);
      return;
    }
    entry.kept = finished.outcome;
    this.keptOrder.add(key);
    while (this.keptOrder.size > this.maxKept) {
      const oldest = this.keptOrder.values().next().value as CaptureKey;
      this.remove(oldest);
      this.tombstones.add(oldest);
      this.index(oldest);
      this.onEvict(oldest);
    }
    while (this.tombstones.size > this.maxTombstones) {
      const oldest = this.tombstones.values().next().value as CaptureKey;
      this.tombstones.delete(oldest);
      this.unindex(oldest);
    }
  }

  private remove(key: CaptureKey): void {
    this.entries.delete(key);
    this.keptOrder.delete(key);
    if (!this.tombstones.has(key)) this.unindex(key);
  }

  private index(key: CaptureKey): void {
    const r = parseCaptureKey(key)?.rollout_id ?? key;
    let set = this.byRollout.get(r);
    if (!set) this.byRollout.set(r, (set = new Set()));
    set.add(key);
  }

  private unindex(key: CaptureKey): void {
    const r = parseCaptureKey(key)?.rollout_id ?? key;
    const set = this.byRollout.get(r);
    if (!set) return;
    set.delete(key);
    if (set.size === 0) this.byRollout.delete(r);
  }
}
