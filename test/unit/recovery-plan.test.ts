// Recovery planning as pure functions (workflows/recovery-plan.ts): ledger + last snapshot scope +
// levels → which saved episodes to restore, then what each unfinished sibling becomes.
import { describe, expect, it } from 'vitest';
import { captureKey } from '../../protocol/ids.js';
import * as L from '../../workflows/ledger.js';
import { dispatchAll, ep, reserve } from '../helpers/ledger.js';
import { planRecovery, restoredRollouts, settleRecovery } from '../../workflows/recovery-plan.js';

const SNAPSHOT = '/ckpt/step_1/rollout_snapshots/snapshot_000001';

describe('planRecovery', () => {
  it('nothing to restore without a published snapshot', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    dispatchAll(l);
    expect(planRecovery(l, { lastSnapshot: null, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1'] })).toEqual({ scope: [], environments: {} });
  });

  it('restores the saved attempts of unsealed siblings at turn; not sealed ones, unsaved ones, or groups at sibling level', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0', { size: 3 });
    reserve(l, 'run.p1', { level: 'sibling' });
    dispatchAll(l);
    L.sealAttempt(l, ep('run.p0.g0'), 1, false);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1', 'run.p1.g0', 'run.p1.g1'] });
    expect(plan.scope).toEqual([ep('run.p0.g1')]);
    expect(plan.environments).toEqual({ 'run.p0.g1': 'counter_env' });
  });

  it('a group-scored group continues whole or not at all', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0', { size: 3, granularity: 'prompt_group' });
    reserve(l, 'run.p1', { size: 2, granularity: 'prompt_group' });
    dispatchAll(l);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1', 'run.p1.g0', 'run.p1.g1'] });
    expect(plan.scope.map(captureKey)).toEqual(['run.p1.g0', 'run.p1.g1']);
  });

  it('a group-scored group some of whose siblings are sealed continues none (their cohort cannot form again); a given-up sibling does not count', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0', { size: 3, granularity: 'prompt_group' });
    reserve(l, 'run.p1', { size: 2, granularity: 'prompt_group' });
    dispatchAll(l);
    L.sealAttempt(l, ep('run.p0.g1'), 1, false);
    L.sealAttempt(l, ep('run.p0.g2'), 0.5, false);
    L.sealAttempt(l, ep('run.p1.g1'), 0, true);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1', 'run.p0.g2', 'run.p1.g0', 'run.p1.g1'] });
    expect(plan.scope.map(captureKey)).toEqual(['run.p1.g0']);
  });

  it('after a second crash before a restored replacement ran, the saved attempt is the one before it', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 1 });
    dispatchAll(l);
    L.continueFromRestore(g.siblings[0]!, 'counter_env'); // N+1 reserved, continued, never dispatched
    expect(planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0'] }).scope).toEqual([ep('run.p0.g0')]);
  });
});

describe('restoredRollouts', () => {
  it('counts a rollout only when its replacement N+1 was installed on its own environment server', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    dispatchAll(l);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1'] });
    expect([...restoredRollouts(plan, { counter_env: ['run.p0.g0-a1'], weather_env: ['run.p0.g1-a1'] })]).toEqual(['run.p0.g0']);
  });
});

describe('settleRecovery', () => {
  it('continued siblings go on as N+1 on their server; the rest start over, their dead attempts retired; sealed ones kept', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 3 });
    dispatchAll(l);
    L.sealAttempt(l, ep('run.p0.g0'), 1, false);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g1', 'run.p0.g2'] });
    const out = settleRecovery(l, plan, { restored: new Set(['run.p0.g1']), restoreFailed: false, cold: false });
    expect(out).toEqual({ continued: ['run.p0.g1-a1'], restarted: ['run.p0.g2-a1'], retire: [ep('run.p0.g2')], superseded: 0 });
    expect(L.currentAttempt(g.siblings[0]!)).toMatchObject({ gym_attempt: 0, status: 'sealed' });
    expect(L.currentAttempt(g.siblings[1]!)).toMatchObject({ gym_attempt: 1, status: 'reserved', continued: true, gym_instance_id: 'counter_env' });
    expect(L.currentAttempt(g.siblings[2]!)).toMatchObject({ gym_attempt: 1, status: 'reserved', continued: false, gym_instance_id: null });
  });

  it('warm: an attempt that never reached Gym is dispatched as it is; cold: its number is burnt (retired) and it starts over', () => {
    for (const cold of [false, true]) {
      const l = L.emptyLedger('run');
      const g = reserve(l, 'run.p0', { size: 1 });
      const out = settleRecovery(l, planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: [] }), { restored: new Set(), restoreFailed: false, cold });
      if (cold) {
        expect(out).toMatchObject({ retire: [ep('run.p0.g0')], restarted: ['run.p0.g0-a1'] });
      } else {
        expect(out).toEqual({ continued: [], restarted: [], retire: [], superseded: 0 });
        expect(L.currentAttempt(g.siblings[0]!)).toMatchObject({ gym_attempt: 0, status: 'reserved' });
      }
    }
  });

  it('a failed restore skips the replacement numbers it retired (N+1) for its scope', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 2 });
    dispatchAll(l);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0'] });
    const out = settleRecovery(l, plan, { restored: new Set(), restoreFailed: true, cold: false });
    // g0 was in the failed restore's scope: N+1 is burnt, it restarts as N+2; g1 simply as N+1.
    expect(out.restarted).toEqual(['run.p0.g0-a2', 'run.p0.g1-a1']);
    expect(L.currentAttempt(g.siblings[0]!).gym_attempt).toBe(2);
  });

  it('a group-scored group that starts over is a new cohort', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 2, granularity: 'prompt_group' });
    dispatchAll(l);
    settleRecovery(l, planRecovery(l, { lastSnapshot: null, lastSnapshotScope: [] }), { restored: new Set(), restoreFailed: false, cold: false });
    expect(g.cohort_attempt).toBe(1);
  });

  it('prompt_group: a group with unfinished work reruns whole, its sealed siblings superseded', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 2, level: 'prompt_group' });
    const done = reserve(l, 'run.p1', { size: 1, level: 'prompt_group' });
    dispatchAll(l);
    L.sealAttempt(l, ep('run.p0.g0'), 1, false);
    L.sealAttempt(l, ep('run.p1.g0'), 1, false);
    const out = settleRecovery(l, planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g1'] }), {
      restored: new Set(),
      restoreFailed: false,
      cold: false,
    });
    expect(out).toMatchObject({ continued: [], superseded: 1 });
    expect(out.restarted.sort()).toEqual(['run.p0.g0-a1', 'run.p0.g1-a1']);
    expect(g.status).toBe('generating');
    // A group with nothing unfinished is left alone.
    expect(L.currentAttempt(done.siblings[0]!)).toMatchObject({ gym_attempt: 0, status: 'sealed' });
  });

  it('a group-scored cohort scored without one sibling (its reply lost in the crash) reruns whole as a new cohort, its sealed siblings superseded (chaos seed 748)', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 3, granularity: 'prompt_group' });
    dispatchAll(l);
    L.sealAttempt(l, ep('run.p0.g1'), 1, false);
    L.sealAttempt(l, ep('run.p0.g2'), 0.5, false);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1', 'run.p0.g2'] });
    const out = settleRecovery(l, plan, { restored: restoredRollouts(plan, {}), restoreFailed: false, cold: false });
    expect(out).toMatchObject({ continued: [], retire: [ep('run.p0.g0')], superseded: 2 });
    expect(out.restarted.sort()).toEqual(['run.p0.g0-a1', 'run.p0.g1-a1', 'run.p0.g2-a1']);
    expect(g.cohort_attempt).toBe(1);
    expect(g.status).toBe('generating');
    for (const s of g.siblings) expect(L.currentAttempt(s)).toMatchObject({ gym_attempt: 1, status: 'reserved', continued: false });
  });

  it('a group-scored cohort the restore installed only in part starts over whole: the installed replacements retired, their numbers skipped', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', { size: 3, granularity: 'prompt_group' });
    dispatchAll(l);
    const plan = planRecovery(l, { lastSnapshot: SNAPSHOT, lastSnapshotScope: ['run.p0.g0', 'run.p0.g1', 'run.p0.g2'] });
    expect(plan.scope).toHaveLength(3);
    const out = settleRecovery(l, plan, { restored: new Set(['run.p0.g0', 'run.p0.g1']), restoreFailed: false, cold: false });
    expect(out.continued).toEqual([]);
    expect(out.restarted.sort()).toEqual(['run.p0.g0-a2', 'run.p0.g1-a2', 'run.p0.g2-a1']);
    expect(out.retire.map(captureKey).sort()).toEqual(['run.p0.g0', 'run.p0.g0-a1', 'run.p0.g1', 'run.p0.g1-a1', 'run.p0.g2']);
    expect(g.cohort_attempt).toBe(1);
  });
});
