// Cohorts of group-scored verification (participants.md §4.10): every member's `/verify` waits
// until all N members of its group attempt arrived, then one judging publishes every reward at
// once. Kept in memory only: the server is `stateless` + `replay`, so after a crash the cohort
// re-forms from the replayed verifies.
import type { ErrorCode } from '../../protocol/errors.js';
import { cohortRewards, type Comparison } from './genrm-judge.js';

export interface CohortMember {
  groupId: string;
  /** `_ng_group_attempt`: a newer one supersedes the older ones of the same group. */
  attempt: number;
  /** `_ng_rollout_index`, 0 … N-1. */
  slot: number;
  promptId: string | undefined;
  /** The answer being judged; an identical retry carries the same text. */
  text: string;
}

export type CohortOutcome =
  | { ok: true; reward: number; maskSample: boolean; failure?: { kind: string; reason: string } }
  | { ok: false; status: number; code: ErrorCode; detail: string };

export interface CohortRegistryOptions {
  size: number;
  collectionTimeoutMs: number;
  comparison: Comparison;
  /** Completed cohorts kept for replays; the oldest are dropped past this many. */
  maxCompleted?: number;
  /** The scoring; defaults to the deterministic judge. */
  score?: (texts: readonly string[], comparison: Comparison) => number[];
}

type Result = { ok: true; rewards: number[]; failure?: { kind: string; reason: string } } | { ok: false; status: number; code: ErrorCode; detail: string };

interface Cohort {
  key: string;
  groupId: string;
  attempt: number;
  promptId: string | undefined;
  texts: Array<string | undefined>;
  filled: number;
  timer: NodeJS.Timeout | undefined;
  result: Result | undefined;
  settle: (r: Result) => void;
  done: Promise<Result>;
}

const fail = (status: number, code: ErrorCode, detail: string): CohortOutcome => ({ ok: false, status, code, detail });

export class CohortRegistry {
  private readonly cohorts = new Map<string, Cohort>();
  /** group → its newest attempt seen. */
  private readonly latest = new Map<string, number>();
  /** Completed cohort keys, oldest first. */
  private readonly completed = new Set<string>();
  private readonly maxCompleted: number;
  private readonly score: (texts: readonly string[], comparison: Comparison) => number[];

  constructor(private readonly opts: CohortRegistryOptions) {
    this.maxCompleted = opts.maxCompleted ?? 10_000;
    this.score = opts.score ?? cohortRewards;
  }

  get pendingCount(): number {
    return this.cohorts.size - this.completed.size;
  }

  async submit(m: CohortMember): Promise<CohortOutcome> {
    const n = this.opts.size;
    if (!Number.isInteger(m.slot) || m.slot < 0 || m.slot >= n) {
      return fail(422, 'invalid_cohort_coordinates', `_ng_rollout_index must be an integer in 0..${n - 1}, got ${m.slot}`);
    }
    const newest = this.latest.get(m.groupId);
    if (newest !== undefined && m.attempt < newest) {
      return fail(409, 'cohort_superseded', `group '${m.groupId}' attempt ${m.attempt} was superseded by attempt ${newest}`);
    }
    if (newest === undefined || m.attempt > newest) {
      if (newest !== undefined)
        this.drop(keyOf(m.groupId, newest), fail(503, 'cohort_superseded', `group '${m.groupId}' attempt ${newest} was superseded by attempt ${m.attempt}`));
      this.latest.set(m.groupId, m.attempt);
    }
    const key = keyOf(m.groupId, m.attempt);
    const c = this.cohorts.get(key) ?? this.create(key, m);
    const have = c.texts[m.slot];
    if (have !== undefined) {
      if (have !== m.text) {
        return fail(409, 'cohort_slot_conflict', `group '${m.groupId}' attempt ${m.attempt} slot ${m.slot} already holds a different response`);
      }
      // An identical retry: an extra waiter, or a replay of the published reward.
    } else {
      if (c.promptId !== undefined && m.promptId !== undefined && c.promptId !== m.promptId) {
        return fail(409, 'cohort_prompt_mismatch', `group '${m.groupId}' is for prompt '${c.promptId}', not '${m.promptId}'`);
      }
      c.promptId ??= m.promptId;
      c.texts[m.slot] = m.text;
      c.filled += 1;
      if (c.filled === n) this.complete(c);
    }
    const r = await c.done;
    if (!r.ok) return r;
    return { ok: true, reward: r.rewards[m.slot]!, maskSample: r.failure !== undefined, ...(r.failure ? { failure: r.failure } : {}) };
  }

  /** Fails every cohort still collecting (server shutdown). */
  close(): void {
    for (const c of [...this.cohorts.values()]) if (!c.result) this.drop(c.key, fail(503, 'cohort_not_collected', 'the server is shutting down'));
  }

  private create(key: string, m: CohortMember): Cohort {
    let settle!: (r: Result) => void;
    const done = new Promise<Result>((resolve) => (settle = resolve));
    const c: Cohort = {
      key,
      groupId: m.groupId,
      attempt: m.attempt,
      promptId: m.promptId,
      texts: new Array<string | undefined>(this.opts.size).fill(undefined),
      filled: 0,
      timer: undefined,
      result: undefined,
      settle,
      done,
    };
    // The collection deadline starts with the first member.
    c.timer = setTimeout(() => {
      if (this.cohorts.get(key) !== c || c.result) return;
      const detail = `did not collect group '${m.groupId}' attempt ${m.attempt}: ${c.filled} of ${this.opts.size} members within ${this.opts.collectionTimeoutMs / 1000} s`;
      this.drop(key, fail(503, 'cohort_not_collected', detail));
    }, this.opts.collectionTimeoutMs);
    this.cohorts.set(key, c);
    return c;
  }

  private complete(c: Cohort): void {
    clearTimeout(c.timer);
    const texts = c.texts as string[];
    let result: Result;
    try {
      result = { ok: true, rewards: this.score(texts, this.opts.comparison) };
    } catch (err) {
      // Judge failure: a masked placeholder reward for every member (§4.10 step 6).
      result = { ok: true, rewards: texts.map(() => 0), failure: { kind: 'judge_failed', reason: (err as Error)?.message ?? String(err) } };
    }
    c.result = result;
    c.settle(result);
    this.completed.add(c.key);
    while (this.completed.size > this.maxCompleted) {
      const oldest = this.completed.values().next().value!;
      const gone = this.cohorts.get(oldest);
      this.completed.delete(oldest);
      this.cohorts.delete(oldest);
      if (gone && this.latest.get(gone.groupId) === gone.attempt) this.latest.delete(gone.groupId);
    }
  }

  /** Removes a cohort; one still collecting releases its waiters with `why`. */
  private drop(key: string, why: CohortOutcome): void {
    const c = this.cohorts.get(key);
    if (!c) return;
    this.cohorts.delete(key);
    this.completed.delete(key);
    clearTimeout(c.timer);
    if (!c.result && !why.ok) {
      c.result = why;
      c.settle(why);
    }
  }
}

function keyOf(groupId: string, attempt: number): string {
  return `${groupId}\u0000${attempt}`;
}
