// The run state under its rollout attempts' reports (workflows/run/reports.ts, pure): results
// sealed once, a crashed Gym noted for recovery, live failures held until the run has looked at
// Gym and then put down to a crash or retried within the budget (or given up), cohort-mates of a
// group that starts over listed to be stopped.
import { describe, expect, it } from 'vitest';
import type { RolloutReport } from '../../protocol/controller.js';
import { captureKey, type EpisodeId } from '../../protocol/ids.js';
import * as D from '../../workflows/deadlines.js';
import * as L from '../../workflows/ledger.js';
import { ep, reserve } from '../helpers/ledger.js';
import { applyReports, settleFailures, type AppliedReports } from '../../workflows/run/reports.js';
import { initialState, type RunState } from '../../workflows/run/state.js';
import { GYM_RESTARTED } from '../../workflows/rolloutAttempt.js';
import { runConfig } from '../workflows/harness.js';

const cfg = runConfig('reports', { async_rl: { max_attempts_per_sibling: 2 } });

/** Applies the reports, then settles the live failures with Gym found up with the same processes. */
function applyWithGymUp(st: RunState): AppliedReports {
  const applied = applyReports(st, cfg);
  const settled = settleFailures(st, cfg, false);
  return { toStop: [...applied.toStop, ...settled.toStop], gaveUp: [...applied.gaveUp, ...settled.gaveUp] };
}

/** A run state with one group of `size` siblings, every attempt dispatched and in flight with a deadline. */
function runWithGroup(size: number, granularity: L.RecoveryGranularity = 'sibling'): RunState {
  const st = initialState(cfg);
  reserve(st.ledger, 'reports.p0', { size, granularity });
  dispatchReserved(st);
  return st;
}

function dispatchReserved(st: RunState): void {
  for (const { group, sibling, attempt } of L.reservedAttempts(st.ledger)) {
    L.markDispatched(group, sibling, 'counter_env');
    const episode = L.episodeOfAttempt(sibling, attempt);
    const key = captureKey(episode);
    st.inFlight[key] = { episode, groupId: group.group_id, environment: 'counter_env', workflowId: `wf/${key}`, stopSignalled: false };
    D.addDeadline(st.deadlines, key, 60_000);
  }
}

function report(episode: EpisodeId, over: Partial<RolloutReport> = {}): RolloutReport {
  const completed = over.status === undefined || over.status === 'completed';
  return { captureKey: captureKey(episode), episode, status: 'completed', reward: completed ? 0.5 : null, terminal: false, result: null, seconds: 1, ...over };
}

const failed = (episode: EpisodeId, over: Partial<RolloutReport> = {}): RolloutReport =>
  report(episode, { status: 'failed', reward: null, reason: 'tool call failed', ...over });

describe('applyReports', () => {
  it('seals a completed attempt once: in flight and its deadline gone, counted once even if reported twice', () => {
    const st = runWithGroup(2);
    st.reports = [report(ep('reports.p0.g0')), report(ep('reports.p0.g0'))];
    expect(applyReports(st, cfg)).toEqual({ toStop: [], gaveUp: [] });
    expect(st.completedRollouts).toBe(1);
    expect(Object.keys(st.inFlight)).toEqual(['reports.p0.g1']);
    D.tick(st.deadlines, 120_000);
    expect(D.expired(st.deadlines)).toEqual(['reports.p0.g1']);
    expect(st.reports).toEqual([]);
    expect(L.currentAttempt(st.ledger.groups['reports.p0']!.siblings[0]!)).toMatchObject({ status: 'sealed', reward: 0.5 });
  });

  it('a Gym restart under an attempt is not its failure: recovery is needed, the attempt stays dispatched', () => {
    const st = runWithGroup(1);
    st.reports = [failed(ep('reports.p0.g0'), { reason: GYM_RESTARTED })];
    applyReports(st, cfg);
    expect(st).toMatchObject({ recoveryNeeded: true, failedRollouts: 0 });
    expect(L.currentAttempt(st.ledger.groups['reports.p0']!.siblings[0]!)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
  });

  it('a live failure reserves the next attempt; past the budget (or terminal) the sibling gives up with a masked placeholder', () => {
    const st = runWithGroup(2);
    st.reports = [failed(ep('reports.p0.g0')), failed(ep('reports.p0.g1'), { terminal: true, reason: 'bad task' })];
    expect(applyWithGymUp(st).gaveUp).toEqual([{ key: 'reports.p0.g1', reason: 'bad task' }]);
    const [g0, g1] = st.ledger.groups['reports.p0']!.siblings;
    expect(L.currentAttempt(g0!)).toMatchObject({ gym_attempt: 1, status: 'reserved' });
    expect(L.currentAttempt(g1!)).toMatchObject({ status: 'sealed', reward: 0, mask_sample: true });
    dispatchReserved(st);
    st.reports = [failed(ep('reports.p0.g0', 1))];
    expect(applyWithGymUp(st).gaveUp).toEqual([{ key: 'reports.p0.g0-a1', reason: 'tool call failed' }]);
    expect(st.failedRollouts).toBe(3);
    expect(st.completedRollouts).toBe(0);
  });

  it('the report of a superseded attempt changes nothing', () => {
    const st = runWithGroup(1);
    st.reports = [failed(ep('reports.p0.g0'))];
    applyWithGymUp(st);
    st.reports = [failed(ep('reports.p0.g0'))];
    applyWithGymUp(st);
    expect(st.failedRollouts).toBe(1);
    expect(L.currentAttempt(st.ledger.groups['reports.p0']!.siblings[0]!)).toMatchObject({ gym_attempt: 1, status: 'reserved' });
  });

  it('a cohort that starts over lists its members still in flight to be stopped, not one already told', () => {
    const st = runWithGroup(3, 'prompt_group');
    st.inFlight['reports.p0.g2']!.stopSignalled = true;
    st.reports = [failed(ep('reports.p0.g0'))];
    const { toStop } = applyWithGymUp(st);
    expect(toStop.map((f) => f.workflowId)).toEqual(['wf/reports.p0.g1']);
    // The whole cohort reruns as the next attempt.
    expect(st.ledger.groups['reports.p0']!.siblings.map((s) => L.currentAttempt(s).gym_attempt)).toEqual([1, 1, 1]);
  });

  it('a live failure waits for the run to look at Gym: nothing is charged before; found under a Gym crash, it costs no attempt', () => {
    const st = runWithGroup(2);
    st.reports = [failed(ep('reports.p0.g0')), failed(ep('reports.p0.g1'), { terminal: true })];
    expect(applyReports(st, cfg)).toEqual({ toStop: [], gaveUp: [] });
    expect(st.unconfirmedFailures.map((r) => r.captureKey)).toEqual(['reports.p0.g0', 'reports.p0.g1']);
    expect(st).toMatchObject({ failedRollouts: 0, recoveryNeeded: false });
    expect(Object.keys(st.inFlight)).toEqual([]);
    expect(settleFailures(st, cfg, true)).toEqual({ toStop: [], gaveUp: [] });
    expect(st).toMatchObject({ failedRollouts: 0, recoveryNeeded: true, unconfirmedFailures: [] });
    for (const sib of st.ledger.groups['reports.p0']!.siblings) expect(L.currentAttempt(sib)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
  });

  it("during a recovery a live failure is the crash's at once; a timed-out attempt is charged at once", () => {
    const st = runWithGroup(2);
    st.recoveryNeeded = true;
    st.reports = [failed(ep('reports.p0.g0')), failed(ep('reports.p0.g1'), { status: 'timed_out', reason: 'rollout deadline expired' })];
    applyReports(st, cfg);
    expect(st.unconfirmedFailures).toEqual([]);
    expect(st.failedRollouts).toBe(1);
    const [g0, g1] = st.ledger.groups['reports.p0']!.siblings;
    expect(L.currentAttempt(g0!)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
    expect(L.currentAttempt(g1!)).toMatchObject({ gym_attempt: 1, status: 'reserved' });
  });
});
