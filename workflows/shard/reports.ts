// What a shard's rollout attempts report, applied to its state (pure: no workflow APIs, unit-tested
// on its own): results sealed (and sealed groups queued for the run), a crashed Gym noted, live
// failures held until the shard has looked at Gym, then either put down to a Gym crash or retried
// within the attempt budget (or given up), cohort-mates of a group that starts over listed to be
// stopped.
import type { RolloutReport } from '../../protocol/controller.js';
import { captureKey } from '../../protocol/episode-id.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import { HOLDERS } from '../messages.js';
import { GYM_RESTARTED } from '../rolloutAttempt.js';
import { groupIndex, type InFlight, type ShardState } from './state.js';

export interface AppliedReports {
  /** In-flight attempts whose cohort started over without them: to be told to stop. */
  toStop: InFlight[];
  /** Siblings given up on (attempt budget spent, or a terminal failure), with the reason. */
  gaveUp: Array<{ key: string; reason: string | undefined }>;
}

/** The sibling whose current attempt the report is about, or undefined (a superseded attempt). */
function currentSibling(st: ShardState, r: RolloutReport): ReturnType<typeof L.findSibling> {
  const found = L.findSibling(st.ledger, r.episode.rollout_id);
  return found && L.currentAttempt(found.sibling).gym_attempt === r.episode.attempt ? found : undefined;
}

/**
 * Applies the reports received so far. A live failure (`failed`) is not charged to its sibling yet:
 * a Gym server that died under the episode (a tool server killed, its connections refused) fails
 * it the same way a bad episode does, and a crash must not spend the attempt budget. It waits in
 * `unconfirmedFailures` until the run has looked at Gym (settleFailures); during a recovery every
 * failure is put down to the crash at once.
 */
export function applyReports(st: ShardState, maxAttempts: number): AppliedReports {
  const out: AppliedReports = { toStop: [], gaveUp: [] };
  const reports = st.reports;
  st.reports = [];
  for (const r of reports) {
    const key = captureKey(r.episode);
    const flight = st.inFlight[key];
    if (r.reported && flight?.stopSignalled && !flight.stopUndelivered) {
      // Sent by its `/run` activity while the attempt was being told to stop: the attempt may be
      // retiring it (its records and model calls gone), so the attempt's own report decides; if the
      // stop never reached it, it had ended without retiring, and this one counts (shard/stops.ts).
      flight.heldReport = r;
      continue;
    }
    delete st.inFlight[key];
    D.removeDeadline(st.deadlines, key);
    if (r.status === 'completed' && r.reward !== null) {
      if (L.sealAttempt(st.ledger, r.episode, r.reward, false) === 'sealed') {
        st.completed += 1;
        announceIfSealed(st, r);
      }
      continue;
    }
    const found = currentSibling(st, r);
    if (!found) continue;
    // Its completed report came first (the `/run` signalled it while the attempt was being stopped).
    if (L.currentAttempt(found.sibling).status === 'sealed') continue;
    if (mateOfGivenUp(st, found, r, out)) continue;
    // A retired one too: during a recovery only a cohort broken by the crash is stopped.
    if (r.reason === GYM_RESTARTED || ((r.status === 'failed' || r.status === 'retired') && inRecovery(st))) {
      // Not the attempt's fault: the Gym process under it restarted. Recovery decides whether
      // it continues from the last snapshot (N+1) or starts over; it stays `dispatched` until then.
      st.gymCrashed ??= `${r.captureKey}: ${r.reason ?? r.status}`;
      stopBrokenCohort(st, found, out);
      continue;
    }
    if (r.status === 'failed') {
      st.unconfirmedFailures.push(r);
      continue;
    }
    // Timed out or retired by its shard: the attempt's own failure.
    chargeFailure(st, maxAttempts, r, out);
  }
  return out;
}

/** A recovery holds admission (or a crash was noticed and not yet recovered from): every live failure is the crash's. */
function inRecovery(st: ShardState): boolean {
  return st.gymCrashed !== null || st.holds.admission.includes(HOLDERS.recovery);
}

/** Queues the report of a group whose last sibling the result sealed. */
function announceIfSealed(st: ShardState, r: RolloutReport): void {
  const found = L.findSibling(st.ledger, r.episode.rollout_id);
  if (found?.group.status === 'ready_to_finalize') st.sealed.push(groupIndex(found.group));
}

/**
 * The live failures held by applyReports, once the shard has looked at Gym: with a Gym server
 * restarted or unreachable (`gymCrashed`) they are the crash's (the run recovers, the siblings stay
 * `dispatched` for it); with the same processes all answering, each is its sibling's failure.
 */
export function settleFailures(st: ShardState, maxAttempts: number, gymCrashed: boolean): AppliedReports {
  const out: AppliedReports = { toStop: [], gaveUp: [] };
  const failures = st.unconfirmedFailures;
  st.unconfirmedFailures = [];
  for (const r of failures) {
    const found = currentSibling(st, r);
    if (!found) continue;
    if (mateOfGivenUp(st, found, r, out)) continue;
    if (!gymCrashed) {
      chargeFailure(st, maxAttempts, r, out);
      continue;
    }
    st.gymCrashed ??= `${r.captureKey}: ${r.reason ?? r.status} (a Gym server restarted or did not answer)`;
    stopBrokenCohort(st, found, out);
  }
  return out;
}

/**
 * A sibling lost to a crash breaks a cohort that re-forms only whole (group-scored verification):
 * its members still running would wait in /verify for a cohort that cannot form, and hold the
 * recovery's drain for ever. They are stopped now, whether the loss was noticed by the shard's own
 * look at Gym or arrived while a recovery was already on (chaos seed 3: an agent killed during a
 * checkpoint); the recovery continues or restarts the cohort together.
 */
function stopBrokenCohort(st: ShardState, found: NonNullable<ReturnType<typeof currentSibling>>, out: AppliedReports): void {
  if (found.group.recovery_granularity !== 'prompt_group') return;
  for (const s of found.group.siblings) {
    if (s === found.sibling) continue;
    const flight = st.inFlight[L.siblingKey(s)];
    if (flight && !flight.stopSignalled && !out.toStop.includes(flight)) out.toStop.push(flight);
  }
}

/** Starts the sibling (or its whole group) over as the next attempt within the budget, or gives it up. */
function chargeFailure(st: ShardState, maxAttempts: number, r: RolloutReport, out: AppliedReports): void {
  const found = currentSibling(st, r)!;
  const key = captureKey(r.episode);
  st.failed += 1;
  const attemptsSoFar = found.sibling.attempts.length;
  if (attemptsSoFar >= maxAttempts || r.terminal) {
    // Give up on this sibling: a masked zero-reward placeholder keeps its group trainable.
    L.sealAttempt(st.ledger, r.episode, 0, true);
    out.gaveUp.push({ key, reason: r.reason });
    if (found.group.recovery_granularity === 'prompt_group') giveUpCohort(st, found.group, key, out);
    announceIfSealed(st, r);
    return;
  }
  const affected = L.failAttempt(st.ledger, r.episode, r.reason ?? r.status);
  // A cohort that starts over together: its members still running are stopped (retired,
  // caller first, by their own workflows), not left waiting in /verify for a cohort that
  // will never form again (they would hold recovery and the run's end until its timeout).
  for (const s of affected) {
    const prev = s === found.sibling ? undefined : s.attempts[s.attempts.length - 2];
    const flight = prev && st.inFlight[captureKey(L.episodeOfAttempt(s, prev))];
    if (flight && !flight.stopSignalled) out.toStop.push(flight);
  }
}

/**
 * A cohort that re-forms only whole cannot be scored without a member given up, so the others are
 * given up with it: those not started at once, those running stopped first (or they would wait in
 * /verify for a cohort that never forms: chaos seed 701, the run hung at its step) and given up
 * when they report, so that the group is handed over (and forgotten in Gym) only once none runs.
 */
function giveUpCohort(st: ShardState, group: L.PromptGroup, gaveUpKey: string, out: AppliedReports): void {
  for (const s of group.siblings) {
    const cur = L.currentAttempt(s);
    const key = L.siblingKey(s);
    if (cur.status === 'reserved') {
      sealMasked(cur);
      out.gaveUp.push({ key, reason: `its cohort cannot form without ${gaveUpKey}` });
      continue;
    }
    const flight = cur.status === 'dispatched' ? st.inFlight[key] : undefined;
    if (flight && !flight.stopSignalled && !out.toStop.includes(flight)) out.toStop.push(flight);
  }
  if (group.siblings.every((s) => L.currentAttempt(s).status === 'sealed')) group.status = 'ready_to_finalize';
}

/** The report of a cohort-mate of a sibling given up (giveUpCohort): given up too, whatever it says, never charged. */
function mateOfGivenUp(st: ShardState, found: NonNullable<ReturnType<typeof currentSibling>>, r: RolloutReport, out: AppliedReports): boolean {
  const { group } = found;
  if (group.recovery_granularity !== 'prompt_group') return false;
  const givenUp = group.siblings.find((s) => s !== found.sibling && L.currentAttempt(s).status === 'sealed' && L.currentAttempt(s).mask_sample === true);
  if (!givenUp) return false;
  sealMasked(L.currentAttempt(found.sibling));
  out.gaveUp.push({ key: captureKey(r.episode), reason: `its cohort cannot form without ${L.siblingKey(givenUp)}` });
  if (group.siblings.every((s) => L.currentAttempt(s).status === 'sealed')) group.status = 'ready_to_finalize';
  announceIfSealed(st, r);
  return true;
}

function sealMasked(a: L.Attempt): void {
  a.status = 'sealed';
  a.reward = 0;
  a.mask_sample = true;
}
