// What the run's rollout attempts report, applied to its state (pure: no workflow APIs, unit-tested
// on its own): results sealed, live failures retried within the attempt budget or given up, a
// crashed Gym noted for recovery, cohort-mates of a group that starts over listed to be stopped.
import type { RunConfig } from '../../protocol/run-config.js';
import { captureKey } from '../../protocol/episode-id.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import { GYM_RESTARTED } from '../rolloutAttempt.js';
import type { InFlight, RunState } from './state.js';

export interface AppliedReports {
  /** In-flight attempts whose cohort started over without them: to be told to stop. */
  toStop: InFlight[];
  /** Siblings given up on (attempt budget spent, or a terminal failure), with the reason. */
  gaveUp: Array<{ key: string; reason: string | undefined }>;
}

export function applyReports(st: RunState, cfg: RunConfig): AppliedReports {
  const out: AppliedReports = { toStop: [], gaveUp: [] };
  const reports = st.reports;
  st.reports = [];
  for (const r of reports) {
    const key = captureKey(r.episode);
    delete st.inFlight[key];
    D.removeDeadline(st.deadlines, key);
    if (r.status === 'completed' && r.reward !== null) {
      const sealed = L.sealAttempt(st.ledger, r.episode, r.reward, false);
      if (sealed === 'sealed') st.completedRollouts += 1;
      continue;
    }
    // A failed, timed-out or retired attempt (already retired by its workflow): start the
    // sibling (or its whole group) over as the next attempt, within the attempt budget.
    const found = L.findSibling(st.ledger, r.episode.rollout_id);
    if (!found || L.currentAttempt(found.sibling).gym_attempt !== r.episode.attempt) continue;
    if (r.reason === GYM_RESTARTED) {
      // Not the attempt's fault: the Gym process under it restarted. Recovery decides whether
      // it continues from the last snapshot (N+1) or starts over; it stays `dispatched` until then.
      st.recoveryNeeded = true;
      continue;
    }
    st.failedRollouts += 1;
    const attemptsSoFar = found.sibling.attempts.length;
    if (attemptsSoFar >= cfg.async_rl.max_attempts_per_sibling || r.terminal) {
      // Give up on this sibling: a masked zero-reward placeholder keeps its group trainable.
      L.sealAttempt(st.ledger, r.episode, 0, true);
      out.gaveUp.push({ key, reason: r.reason });
      continue;
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
  return out;
}

