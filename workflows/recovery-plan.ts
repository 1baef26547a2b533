// Recovery after a Gym crash as two pure steps over the ledger (design.md "Recovery",
// controller.md §5.5–5.6): which saved episodes to restore, and — once the restore has answered —
// what every unfinished sibling becomes: continued as attempt N+1 from its saved turn, or started
// over from its input. Sealed work is never redone, except where `prompt_group` says a group reruns
// whole.
import { captureKey, type CaptureKey, type EpisodeId } from '../protocol/episode-id.js';
import * as L from './ledger.js';

export interface RecoveryPlan {
  /** The saved attempts N to restore as N+1: the restore's scope. */
  scope: EpisodeId[];
  /** The environment server of each scope entry (by rollout ID): where its replacement must be installed. */
  environments: Record<string, string>;
}

export interface RecoveryPlanInput {
  /** The latest published snapshot, or null (nothing can continue). */
  lastSnapshot: string | null;
  /** The capture keys that snapshot continues. */
  lastSnapshotScope: readonly CaptureKey[];
}

/**
 * The saved attempt N of an unsealed sibling: its current attempt if it was in flight and saved, or
 * the attempt before a restored replacement that never started (a second crash before it ran).
 */
function savedEpisode(sib: L.Sibling, saved: ReadonlySet<CaptureKey>): EpisodeId | undefined {
  const cur = L.currentAttempt(sib);
  if (cur.status === 'dispatched' && saved.has(L.siblingKey(sib))) return L.episodeOfAttempt(sib, cur);
  if (cur.status === 'reserved' && cur.continued) {
    const prev = sib.attempts[sib.attempts.length - 2];
    if (prev && saved.has(captureKey(L.episodeOfAttempt(sib, prev)))) return L.episodeOfAttempt(sib, prev);
  }
  return undefined;
}

/**
 * A cohort that re-forms only whole, some of whose siblings are sealed: they were scored in one
 * cohort with the unfinished ones, whose replies the crash lost (chaos seed 748: the worker died
 * during the /run, then the environment server with the reply it kept). The unfinished siblings
 * alone can never form that cohort again, continued or started over, so the group reruns whole as
 * a new cohort, its sealed siblings too, as after a live failure (ledger.ts `failAttempt`). A
 * given-up (masked) sibling is not a score: its cohort is given up, not rerun.
 */
function scoredWithoutSome(group: L.PromptGroup): boolean {
  if (group.recovery_granularity !== 'prompt_group') return false;
  return group.siblings.some((s) => {
    const cur = L.currentAttempt(s);
    return cur.status === 'sealed' && cur.mask_sample !== true;
  });
}

/** The restore scope: every unsealed sibling of a `turn` group whose attempt the snapshot saved; group-scored groups whole or not at all. */
export function planRecovery(ledger: L.Ledger, input: RecoveryPlanInput): RecoveryPlan {
  if (!input.lastSnapshot) return { scope: [], environments: {} };
  const saved = new Set(input.lastSnapshotScope);
  const unsealed = L.unsealedSiblings(ledger);
  const byGroup = new Map<L.PromptGroup, L.Sibling[]>();
  for (const u of unsealed) byGroup.set(u.group, [...(byGroup.get(u.group) ?? []), u.sibling]);
  const scope: EpisodeId[] = [];
  const environments: Record<string, string> = {};
  for (const [group, siblings] of byGroup) {
    // Only groups resolved to restore at `turn` continue from saved turns (§5.5, §5.6).
    if (group.restore_level !== 'turn' || scoredWithoutSome(group)) continue;
    const episodes = siblings.map((s) => savedEpisode(s, saved));
    // Group-scored groups re-form at /verify only whole: all their unfinished siblings or none.
    const continuing = group.recovery_granularity === 'prompt_group' && episodes.some((e) => e === undefined) ? [] : episodes;
    for (const e of continuing) {
      if (!e) continue;
      scope.push(e);
      environments[e.rollout_id] = group.environment;
    }
  }
  return { scope, environments };
}

/** The rollouts the restore installed as N+1, from its answer (server name → replacement capture keys). */
export function restoredRollouts(plan: RecoveryPlan, installed: Readonly<Record<string, readonly CaptureKey[]>>): Set<string> {
  const out = new Set<string>();
  for (const e of plan.scope) {
    const replacement = captureKey({ rollout_id: e.rollout_id, attempt: e.attempt + 1 });
    if ((installed[plan.environments[e.rollout_id]!] ?? []).includes(replacement)) out.add(e.rollout_id);
  }
  return out;
}

export interface SettleInput {
  /** Rollouts whose saved episode the restore installed as N+1 (`restoredRollouts`). */
  restored: ReadonlySet<string>;
  /** The restore was tried and failed: its scope's replacements N+1 were retired, so they are skipped. */
  restoreFailed: boolean;
  /** A cold start on a snapshot another run wrote (reserved attempts may have reached Gym after its cut). */
  cold: boolean;
}

export interface RecoveryOutcome {
  /** Each continued sibling, by the capture key it goes on as (N+1). */
  continued: CaptureKey[];
  /** Each sibling that starts over, by the capture key of its next attempt. */
  restarted: CaptureKey[];
  /** Dead attempts to retire everywhere before anything reruns (a harness that outlived the crash). */
  retire: EpisodeId[];
  /** Sealed results a `prompt_group` rerun supersedes: each counts again when its rerun seals. */
  superseded: number;
}

/** Applies the recovery to the ledger: continued siblings go on as N+1, everything else unfinished starts over. */
export function settleRecovery(ledger: L.Ledger, plan: RecoveryPlan, input: SettleInput): RecoveryOutcome {
  const out: RecoveryOutcome = { continued: [], restarted: [], retire: [], superseded: 0 };
  const unsealed = L.unsealedSiblings(ledger);
  const inScope = new Set(plan.scope.map((e) => e.rollout_id));
  // Groups with unfinished work that rerun whole, sealed siblings too: by `prompt_group`, or a
  // cohort scored without some of its siblings, always as a new cohort (taken before any sibling moves).
  const groups = [...new Set(unsealed.map((u) => u.group))];
  const lostReplies = groups.filter(scoredWithoutSome);
  const rerunWhole = new Set(groups.filter((g) => g.restore_level === 'prompt_group' || lostReplies.includes(g)));
  const cohortRestarted = new Set<L.PromptGroup>(lostReplies);
  // A cohort that re-forms only whole continues whole or not at all: one whose every unfinished
  // sibling the restore did not install starts over entirely (chaos seed 28: the continued
  // siblings' task named the old cohort, the restarted ones a new one).
  const broken = new Set<L.PromptGroup>();
  for (const { group, sibling } of unsealed) {
    if (group.recovery_granularity === 'prompt_group' && !input.restored.has(sibling.rollout_id)) broken.add(group);
  }
  for (const { group, sibling } of unsealed) {
    const cur = L.currentAttempt(sibling);
    if (input.restored.has(sibling.rollout_id) && broken.has(group)) {
      // Installed as N+1 all the same: that replacement and the dead attempt are retired, and
      // the sibling starts over above the replacement's number.
      if (cur.status === 'dispatched') {
        out.retire.push(L.episodeOfAttempt(sibling, cur), { rollout_id: sibling.rollout_id, attempt: cur.gym_attempt + 1 });
        L.restartFromInput(sibling, 'gym_crash', 1);
      } else {
        out.retire.push(L.episodeOfAttempt(sibling, cur));
        L.restartFromInput(sibling, 'gym_crash');
      }
      cohortRestarted.add(group);
      out.restarted.push(L.siblingKey(sibling));
      continue;
    }
    if (input.restored.has(sibling.rollout_id)) {
      // A reserved replacement (second crash before it ran) is restored again as the same N+1.
      if (cur.status === 'dispatched') L.continueFromRestore(sibling, group.environment);
      out.continued.push(L.siblingKey(sibling));
      continue;
    }
    if (cur.status === 'reserved' && !cur.continued) {
      if (!input.cold) continue; // never reached Gym: dispatched as it is
      // Cold start: the run that wrote the cut may have dispatched it after the cut; its attempt
      // number is burnt (retired) and the sibling starts over as the next one.
      out.retire.push(L.episodeOfAttempt(sibling, cur));
    }
    if (cur.status === 'dispatched') out.retire.push(L.episodeOfAttempt(sibling, cur));
    if (group.recovery_granularity === 'prompt_group') cohortRestarted.add(group);
    L.restartFromInput(sibling, 'gym_crash', input.restoreFailed && inScope.has(sibling.rollout_id) ? 1 : 0);
    out.restarted.push(L.siblingKey(sibling));
  }
  for (const g of cohortRestarted) g.cohort_attempt = (g.cohort_attempt ?? 0) + 1;
  // `prompt_group`: saved turns are thrown away and every group with unfinished work reruns whole.
  for (const g of rerunWhole) {
    for (const sib of g.siblings) {
      if (L.currentAttempt(sib).status !== 'sealed') continue;
      out.superseded += 1;
      L.restartFromInput(sib, 'prompt_group_rerun');
      out.restarted.push(L.siblingKey(sib));
    }
    g.status = 'generating';
  }
  return out;
}
