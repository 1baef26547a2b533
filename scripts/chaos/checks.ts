// What must hold after every fault schedule, as pure checks over what the harness collected (the
// run's summary, the rollout attempt workflows, the backend's call log, participant statuses, the
// checkpoint directory). Each returns the violations it found, one line each.

export interface CompletedAttempt {
  /** The attempt's capture key (`<rollout>` or `<rollout>-a<N>`). */
  key: string;
  reward: number | null;
}

/**
 * Exactly `expected` rollouts completed, each exactly once (`started`: every rollout that had an
 * attempt, so one that never completed is named); rewards in [0, 1]. The one exception: a
 * group-scored cohort that lost a member's reply in a crash reruns whole, its sealed siblings
 * superseded (workflows/recovery-plan.ts `scoredWithoutSome`), so a rollout may complete again, but
 * only if every sibling of its group that completed did so last in a later attempt: the whole group
 * reran, not one sibling.
 */
export function checkCompletions(expected: number, started: ReadonlySet<string>, completed: ReadonlyMap<string, CompletedAttempt[]>): string[] {
  const out: string[] = [];
  const missing = [...started].filter((r) => !completed.get(r)?.length);
  if (missing.length) out.push(`${missing.length} rollouts never completed (${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ', …' : ''})`);
  if (completed.size !== expected) out.push(`${completed.size} rollouts completed, expected ${expected}`);
  const rerunWhole = (rollout: string): boolean => {
    const group = groupOf(rollout);
    const first = Math.min(...completed.get(rollout)!.map((a) => attemptOf(a.key)));
    return [...completed].every(([r, as]) => groupOf(r) !== group || Math.max(...as.map((a) => attemptOf(a.key))) > first);
  };
  for (const [rollout, attempts] of completed) {
    if (attempts.length > 1 && !rerunWhole(rollout)) out.push(`${rollout} completed ${attempts.length} times (${attempts.map((a) => a.key).join(', ')})`);
    for (const a of attempts) {
      if (a.reward === null || !(a.reward >= 0 && a.reward <= 1)) out.push(`${a.key}: reward ${String(a.reward)} outside [0, 1]`);
    }
  }
  return out;
}

/** The attempt number of a capture key (`<rollout>-a<N>`; 0 without the suffix). */
function attemptOf(key: string): number {
  const m = /-a(\d+)$/.exec(key);
  return m ? Number(m[1]) : 0;
}

/** The prompt group of a rollout ID (`<run>.s<seed>-p<k>.g<i>` without its `.g<i>`). */
function groupOf(rollout: string): string {
  return rollout.replace(/\.g\d+$/, '');
}

export interface ModelCall {
  /** Global arrival order at the backend. */
  index: number;
  rollout_id: string;
  attempt: number;
}

/** No model call of attempt N arrives after the first call of a later attempt of the same rollout (fencing). */
export function checkModelCalls(calls: readonly ModelCall[]): string[] {
  const byRollout = new Map<string, ModelCall[]>();
  for (const c of calls) byRollout.set(c.rollout_id, [...(byRollout.get(c.rollout_id) ?? []), c]);
  const out: string[] = [];
  for (const [rollout, cs] of byRollout) {
    const firstOf = new Map<number, number>();
    for (const c of cs) if (!firstOf.has(c.attempt) || c.index < firstOf.get(c.attempt)!) firstOf.set(c.attempt, c.index);
    for (const c of cs) {
      const later = [...firstOf].filter(([attempt, first]) => attempt > c.attempt && first < c.index);
      if (later.length) out.push(`${rollout}: a call of attempt ${c.attempt} (#${c.index}) after attempt ${later[0]![0]} began (#${later[0]![1]})`);
    }
  }
  return out;
}

export interface ParticipantStatus {
  name: string;
  phase: string;
  retired_rollouts: number;
  restored_pending?: string[];
  /** The readiness report's counts: sessions, episodes, in-flight and held calls, … */
  counts: Record<string, number>;
}

/** Counts that name work a finished run must not leave behind (the model's cut tallies are history, not work). */
const WORK_COUNTS = new Set(['sessions', 'at_boundary', 'episodes', 'inflight', 'held']);

/** Every participant idle, with nothing parked, held, restored or retired left over. */
export function checkParticipants(statuses: readonly ParticipantStatus[]): string[] {
  const out: string[] = [];
  for (const s of statuses) {
    if (s.phase !== 'idle') out.push(`${s.name}: phase ${s.phase}`);
    if (s.retired_rollouts > 0) out.push(`${s.name}: ${s.retired_rollouts} retire marks left`);
    if (s.restored_pending?.length) out.push(`${s.name}: restored episodes never resumed (${s.restored_pending.join(', ')})`);
    const left = Object.entries(s.counts).filter(([k, n]) => WORK_COUNTS.has(k) && n > 0);
    if (left.length) out.push(`${s.name}: left over ${left.map(([k, n]) => `${k} ${n}`).join(', ')}`);
  }
  return out;
}

export interface AnchorListing {
  /** `bootstrap` or `step_<N>`. */
  anchor: string;
  /** A durable trainer checkpoint is in it (not only snapshots). */
  durable: boolean;
  /** Published snapshot directory names (`snapshot_NNNNNN`). */
  snapshots: string[];
}

/** At most `keepLatestK` published snapshots in the whole checkpoint directory; none under bootstrap once a durable step_N exists. */
export function checkRetention(anchors: readonly AnchorListing[], keepLatestK: number): string[] {
  const out: string[] = [];
  const total = anchors.reduce((n, a) => n + a.snapshots.length, 0);
  if (total > keepLatestK)
    out.push(`${total} snapshots kept (keep_latest_k ${keepLatestK}): ${anchors.flatMap((a) => a.snapshots.map((s) => `${a.anchor}/${s}`)).join(', ')}`);
  const bootstrap = anchors.find((a) => a.anchor === 'bootstrap');
  if (bootstrap?.snapshots.length && anchors.some((a) => a.anchor !== 'bootstrap' && a.durable)) {
    out.push(`bootstrap snapshots left after a durable step anchor: ${bootstrap.snapshots.join(', ')}`);
  }
  return out;
}
