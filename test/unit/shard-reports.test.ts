// A shard's state under its rollout attempts' reports (workflows/shard/reports.ts, pure): results
// sealed once (a sealed group queued for the run), a crashed Gym noted for recovery, live failures
// held until the shard has looked at Gym and then put down to a crash or retried within the budget
// (or given up), cohort-mates of a group that starts over listed to be stopped.
import { describe, expect, it } from 'vitest';
import type { RolloutReport } from '../../protocol/controller.js';
import { captureKey, type EpisodeId } from '../../protocol/ids.js';
import * as D from '../../workflows/deadlines.js';
import * as L from '../../workflows/ledger.js';
import { ep, reserve } from '../helpers/ledger.js';
import { HOLDERS } from '../../workflows/messages.js';
import { applyReports, settleFailures, type AppliedReports } from '../../workflows/shard/reports.js';
import { initialShardState, type ShardState } from '../../workflows/shard/state.js';
import { GYM_RESTARTED } from '../../workflows/rolloutAttempt.js';

const cfg = 2; // max_attempts_per_sibling
type RunState = ShardState;

/** Applies the reports, then settles the live failures with Gym found up with the same processes. */
function applyWithGymUp(st: RunState): AppliedReports {
  const applied = applyReports(st, cfg);
  const settled = settleFailures(st, cfg, false);
  return { toStop: [...applied.toStop, ...settled.toStop], gaveUp: [...applied.gaveUp, ...settled.gaveUp] };
}

/** A run state with one group of `size` siblings, every attempt dispatched and in flight with a deadline. */
function runWithGroup(size: number, granularity: L.RecoveryGranularity = 'sibling'): RunState {
  const st = initialShardState('reports', { seq: 0, admission: [], deadlines: [], reports: [] });
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
    expect(st.completed).toBe(1);
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
    expect(st).toMatchObject({ failed: 0 });
    expect(st.gymCrashed).toContain('reports.p0.g0');
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
    expect(st.failed).toBe(3);
    expect(st.completed).toBe(0);
  });

  it('a completed report its /run sent for an attempt told to stop waits for the attempt’s own: a retired one is charged, not sealed', () => {
    const st = runWithGroup(1);
    const key = 'reports.p0.g0';
    st.inFlight[key]!.stopSignalled = true;
    st.reports = [report(ep(key), { reported: true })];
    applyReports(st, cfg);
    expect(st.completed).toBe(0);
    expect(st.inFlight[key]?.heldReport).toMatchObject({ status: 'completed', reported: true });
    expect(L.currentAttempt(st.ledger.groups['reports.p0']!.siblings[0]!)).toMatchObject({ status: 'dispatched' });
    // The attempt retired itself (its deadline) and says so: that decides; the held report is dropped.
    st.reports = [report(ep(key), { status: 'timed_out', reward: null, reason: 'rollout deadline expired' })];
    applyReports(st, cfg);
    expect(st.inFlight[key]).toBeUndefined();
    expect(st).toMatchObject({ completed: 0, failed: 1 });
    expect(L.currentAttempt(st.ledger.groups['reports.p0']!.siblings[0]!)).toMatchObject({ gym_attempt: 1, status: 'reserved' });
  });

  it('the attempt’s own completed report after a held one seals it once; a stop that never reached it lets the held one count', () => {
    const st = runWithGroup(2);
    const [k0, k1] = ['reports.p0.g0', 'reports.p0.g1'];
    st.inFlight[k0]!.stopSignalled = true;
    st.inFlight[k1]!.stopSignalled = true;
    st.reports = [report(ep(k0), { reported: true }), report(ep(k1), { reported: true })];
    applyReports(st, cfg);
    expect(st.completed).toBe(0);
    // k0 saw the stop only after its `/run` completed: it did not retire, and reports its result itself.
    st.reports = [report(ep(k0))];
    // k1 had ended: the stop signal failed (shard/stops.ts marks the flight, and re-queues what it held).
    st.inFlight[k1]!.stopUndelivered = true;
    st.reports.push(st.inFlight[k1]!.heldReport!);
    applyReports(st, cfg);
    expect(st).toMatchObject({ completed: 2, failed: 0, inFlight: {} });
    for (const s of st.ledger.groups['reports.p0']!.siblings) expect(L.currentAttempt(s)).toMatchObject({ status: 'sealed', reward: 0.5 });
  });

  it('a failure reported for an attempt already sealed changes nothing', () => {
    const st = runWithGroup(1);
    st.reports = [report(ep('reports.p0.g0'), { reported: true }), failed(ep('reports.p0.g0'))];
    applyWithGymUp(st);
    expect(st).toMatchObject({ completed: 1, failed: 0 });
    expect(L.currentAttempt(st.ledger.groups['reports.p0']!.siblings[0]!)).toMatchObject({ gym_attempt: 0, status: 'sealed' });
  });

  it('the report of a superseded attempt changes nothing', () => {
    const st = runWithGroup(1);
    st.reports = [failed(ep('reports.p0.g0'))];
    applyWithGymUp(st);
    st.reports = [failed(ep('reports.p0.g0'))];
    applyWithGymUp(st);
    expect(st.failed).toBe(1);
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
    expect(st).toMatchObject({ failed: 0, gymCrashed: null });
    expect(Object.keys(st.inFlight)).toEqual([]);
    expect(settleFailures(st, cfg, true)).toEqual({ toStop: [], gaveUp: [] });
    expect(st).toMatchObject({ failed: 0, unconfirmedFailures: [] });
    expect(st.gymCrashed).not.toBeNull();
    for (const sib of st.ledger.groups['reports.p0']!.siblings) expect(L.currentAttempt(sib)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
  });

  it("during a recovery a live failure is the crash's at once; a timed-out attempt is charged at once", () => {
    const st = runWithGroup(2);
    st.holds = { seq: 1, admission: [HOLDERS.recovery], deadlines: [], reports: [] };
    st.reports = [failed(ep('reports.p0.g0')), failed(ep('reports.p0.g1'), { status: 'timed_out', reason: 'rollout deadline expired' })];
    applyReports(st, cfg);
    expect(st.unconfirmedFailures).toEqual([]);
    expect(st.failed).toBe(1);
    const [g0, g1] = st.ledger.groups['reports.p0']!.siblings;
    expect(L.currentAttempt(g0!)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
    expect(L.currentAttempt(g1!)).toMatchObject({ gym_attempt: 1, status: 'reserved' });
  });

  it('a group-scored cohort broken by a crash stops its members still running; their retired reports wait for the recovery, uncharged', () => {
    const st = runWithGroup(3, 'prompt_group');
    st.reports = [failed(ep('reports.p0.g0'), { reason: 'agent call failed: ECONNREFUSED' })];
    applyReports(st, cfg);
    const { toStop } = settleFailures(st, cfg, true);
    expect(toStop.map((f) => f.workflowId).sort()).toEqual(['wf/reports.p0.g1', 'wf/reports.p0.g2']);
    st.reports = [
      failed(ep('reports.p0.g1'), { status: 'retired', reason: 'its cohort starts over' }),
      failed(ep('reports.p0.g2'), { status: 'retired', reason: 'its cohort starts over' }),
    ];
    applyReports(st, cfg);
    expect(st.failed).toBe(0);
    for (const sib of st.ledger.groups['reports.p0']!.siblings) expect(L.currentAttempt(sib)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
    expect(Object.keys(st.inFlight)).toEqual([]);
  });

  it('a group-scored cohort member lost while a recovery is already on stops its mates still running too (chaos seed 3)', () => {
    const st = runWithGroup(3, 'prompt_group');
    st.gymCrashed = 'another group: other side closed';
    st.reports = [failed(ep('reports.p0.g0'), { reason: 'other side closed' })];
    const { toStop } = applyReports(st, cfg);
    expect(toStop.map((f) => f.workflowId).sort()).toEqual(['wf/reports.p0.g1', 'wf/reports.p0.g2']);
    expect(st).toMatchObject({ failed: 0, unconfirmedFailures: [] });
    // A sibling-granularity group keeps its other members running: each continues on its own.
    const sib = runWithGroup(3);
    sib.holds = { seq: 1, admission: [HOLDERS.recovery], deadlines: [], reports: [] };
    sib.reports = [failed(ep('reports.p0.g0'))];
    expect(applyReports(sib, cfg).toStop).toEqual([]);
  });

  it('a group-scored cohort member given up gives up its mates: those running are stopped first, the group is handed over once all reported (chaos seed 701)', () => {
    const st = runWithGroup(3, 'prompt_group');
    st.reports = [failed(ep('reports.p0.g0'), { terminal: true, reason: 'close refused' })];
    const { toStop, gaveUp } = applyWithGymUp(st);
    expect(gaveUp).toEqual([{ key: 'reports.p0.g0', reason: 'close refused' }]);
    expect(toStop.map((f) => f.workflowId).sort()).toEqual(['wf/reports.p0.g1', 'wf/reports.p0.g2']);
    const group = st.ledger.groups['reports.p0']!;
    expect(group.status).toBe('generating');
    expect(st.sealed).toEqual([]);
    // Their stop reports (retired, or a failure on the way) give them up too, uncharged.
    st.reports = [
      failed(ep('reports.p0.g1'), { status: 'retired', reason: 'its cohort starts over' }),
      failed(ep('reports.p0.g2'), { reason: 'verify cancelled' }),
    ];
    const later = applyWithGymUp(st);
    expect(later.gaveUp.map((g) => g.key)).toEqual(['reports.p0.g1', 'reports.p0.g2']);
    expect(later.gaveUp[0]!.reason).toContain('reports.p0.g0');
    expect(st.failed).toBe(1);
    for (const sib of group.siblings) expect(L.currentAttempt(sib)).toMatchObject({ gym_attempt: 0, status: 'sealed', reward: 0, mask_sample: true });
    expect(group.status).toBe('ready_to_finalize');
    expect(st.sealed).toEqual([0]);
    expect(Object.keys(st.inFlight)).toEqual([]);
  });

  it('a cohort given up before its next attempts started gives those up at once', () => {
    const st = runWithGroup(2, 'prompt_group');
    st.reports = [failed(ep('reports.p0.g0'))];
    applyWithGymUp(st); // the cohort starts over as attempt 1, not dispatched yet
    const group = st.ledger.groups['reports.p0']!;
    L.markDispatched(group, group.siblings[0]!, 'counter_env');
    st.inFlight['reports.p0.g0-a1'] = {
      episode: ep('reports.p0.g0', 1),
      groupId: group.group_id,
      environment: 'counter_env',
      workflowId: 'wf/a1',
      stopSignalled: false,
    };
    st.reports = [failed(ep('reports.p0.g0', 1))];
    const { gaveUp, toStop } = applyWithGymUp(st);
    expect(gaveUp.map((g) => g.key)).toEqual(['reports.p0.g0-a1', 'reports.p0.g1-a1']);
    expect(toStop).toEqual([]);
    expect(group.status).toBe('ready_to_finalize');
    expect(st.sealed).toEqual([0]);
  });

  it('the last sibling sealed queues its group for the run once, with its live rewards', () => {
    const st = runWithGroup(2);
    st.reports = [report(ep('reports.p0.g0'), { reward: 1 })];
    applyReports(st, cfg);
    expect(st.sealed).toEqual([]);
    st.reports = [failed(ep('reports.p0.g1'), { terminal: true })];
    applyReports(st, cfg);
    settleFailures(st, cfg, false);
    expect(st.sealed).toEqual([0]);
    st.reports = [report(ep('reports.p0.g0'), { reward: 1 })];
    applyReports(st, cfg);
    expect(st.sealed).toHaveLength(1);
  });
});
