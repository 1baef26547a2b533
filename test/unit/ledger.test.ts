// The recovery ledger (workflows/ledger.ts, controller.md §5): reserve → dispatch → seal or live
// failure (sibling / prompt-group granularity) → consume.
import { describe, expect, it } from 'vitest';
import { captureKey } from '../../protocol/ids.js';
import * as L from '../../workflows/ledger.js';
import { dispatchAll, ep, reserve as reserveGroup } from '../helpers/ledger.js';

/** A counter_env group of `size` siblings (the shared fixture, positional). */
const reserve = (l: L.Ledger, id: string, size = 2, granularity: L.RecoveryGranularity = 'sibling'): L.PromptGroup =>
  reserveGroup(l, id, { size, granularity });

describe('ledger: reserve and dispatch', () => {
  it('reserves a group with stable rollout IDs, every sibling at a reserved attempt 0', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', 3);
    expect(g.siblings.map((s) => s.rollout_id)).toEqual(['run.p0.g0', 'run.p0.g1', 'run.p0.g2']);
    expect(g).toMatchObject({ status: 'generating', expected_generations: 3 });
    expect(g.siblings.every((s) => s.attempts.length === 1 && s.attempts[0]!.status === 'reserved' && s.attempts[0]!.gym_attempt === 0)).toBe(true);
    expect(l.order).toEqual(['run.p0']);
    expect(L.unfinishedGroupCount(l)).toBe(1);
    expect(() => reserve(l, 'run.p0')).toThrow(L.LedgerError);
  });

  it('lists reserved attempts in reservation order and dispatches them once', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p1');
    reserve(l, 'run.p0');
    expect(L.reservedAttempts(l).map((x) => x.sibling.rollout_id)).toEqual(['run.p1.g0', 'run.p1.g1', 'run.p0.g0', 'run.p0.g1']);
    dispatchAll(l);
    expect(L.reservedAttempts(l)).toEqual([]);
    expect(L.dispatchedAttempts(l).map(captureKey)).toEqual(['run.p1.g0', 'run.p1.g1', 'run.p0.g0', 'run.p0.g1']);
    const g = l.groups['run.p0']!;
    expect(L.currentAttempt(g.siblings[0]!)).toMatchObject({ status: 'dispatched', gym_instance_id: 'counter_env' });
    // A second dispatch of the same attempt is a bug.
    expect(() => L.markDispatched(g, g.siblings[0]!, 'counter_env')).toThrow(/not reserved/);
  });

  it('a continued attempt must go back to the environment server that owns it', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', 1);
    const a = L.currentAttempt(g.siblings[0]!);
    a.continued = true;
    a.gym_instance_id = 'counter_env';
    expect(() => L.markDispatched(g, g.siblings[0]!, 'weather_env')).toThrow(/must go back to counter_env/);
    L.markDispatched(g, g.siblings[0]!, 'counter_env');
  });
});

describe('ledger: seal', () => {
  it('seals the current attempt; the group is ready once every sibling is sealed', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0');
    dispatchAll(l);
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('sealed');
    expect(g.status).toBe('generating');
    expect(L.readyGroups(l)).toEqual([]);
    expect(L.sealAttempt(l, ep('run.p0.g1'), 0.5, false)).toBe('sealed');
    expect(g.status).toBe('ready_to_finalize');
    expect(L.readyGroups(l).map((x) => x.group_id)).toEqual(['run.p0']);
    expect(L.unfinishedGroupCount(l)).toBe(0);
  });

  it("answers a sealed attempt's outcome, and nothing for an attempt that is not sealed or a group that left", () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    dispatchAll(l);
    expect(L.sealedOutcome(l, ep('run.p0.g0'))).toBeUndefined();
    L.sealAttempt(l, ep('run.p0.g0'), 0.5, true);
    expect(L.sealedOutcome(l, ep('run.p0.g0'))).toEqual({ reward: 0.5, mask_sample: true });
    // Another attempt of the same rollout, a sibling still running, a group never reserved.
    expect(L.sealedOutcome(l, { rollout_id: 'run.p0.g0', attempt: 1 })).toBeUndefined();
    expect(L.sealedOutcome(l, ep('run.p0.g1'))).toBeUndefined();
    expect(L.sealedOutcome(l, ep('run.p9.g0'))).toBeUndefined();
  });

  it('a duplicate identical seal is a no-op; a conflicting seal throws', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    dispatchAll(l);
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('sealed');
    const before = JSON.stringify(l);
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('duplicate');
    expect(JSON.stringify(l)).toBe(before);
    expect(() => L.sealAttempt(l, ep('run.p0.g0'), 0, false)).toThrow(/conflicting second seal/);
    expect(() => L.sealAttempt(l, ep('run.p0.g0'), 1, true)).toThrow(L.LedgerError);
  });

  it('a result for an attempt that was never dispatched, or for an unknown rollout, is not sealed', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('superseded');
    expect(L.currentAttempt(l.groups['run.p0']!.siblings[0]!).status).toBe('reserved');
    expect(L.sealAttempt(l, ep('run.p9.g0'), 1, false)).toBe('unknown');
  });

  it("a superseded attempt's late result is rejected and leaves the new attempt alone", () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0');
    dispatchAll(l);
    L.failAttempt(l, ep('run.p0.g1'), 'timed_out');
    dispatchAll(l);
    // The old attempt's /run reply arrives after all.
    expect(L.sealAttempt(l, ep('run.p0.g1', 0), 1, false)).toBe('superseded');
    const s1 = g.siblings[1]!;
    expect(L.currentAttempt(s1)).toMatchObject({ gym_attempt: 1, status: 'dispatched', reward: null });
    expect(s1.attempts[0]).toMatchObject({ status: 'failed', reward: null });
    expect(L.sealAttempt(l, ep('run.p0.g1', 1), 0.25, false)).toBe('sealed');
  });
});

describe('ledger: live failures', () => {
  it('sibling granularity: only the failed sibling gets a fresh attempt N+1; the old attempt is retired', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', 3);
    dispatchAll(l);
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('sealed');
    const affected = L.failAttempt(l, ep('run.p0.g2'), 'failed');
    expect(affected.map((s) => s.rollout_id)).toEqual(['run.p0.g2']);
    expect(L.attemptsToRetire(affected)).toEqual([ep('run.p0.g2', 0)]);
    const s2 = g.siblings[2]!;
    expect(s2.attempts.map((a) => [a.gym_attempt, a.status])).toEqual([
      [0, 'failed'],
      [1, 'reserved'],
    ]);
    expect(s2.attempts[0]!.reason).toBe('failed');
    expect(L.siblingKey(s2)).toBe('run.p0.g2-a1');
    // The sealed sibling and the one still running are untouched.
    expect(L.currentAttempt(g.siblings[0]!)).toMatchObject({ gym_attempt: 0, status: 'sealed', reward: 1 });
    expect(L.currentAttempt(g.siblings[1]!)).toMatchObject({ gym_attempt: 0, status: 'dispatched' });
    expect(L.reservedAttempts(l).map((x) => L.siblingKey(x.sibling))).toEqual(['run.p0.g2-a1']);
    expect(g.status).toBe('generating');
  });

  it('a failure report for an attempt that is no longer current is ignored', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    dispatchAll(l);
    L.failAttempt(l, ep('run.p0.g0'), 'failed');
    const before = JSON.stringify(l);
    expect(L.failAttempt(l, ep('run.p0.g0', 0), 'failed again')).toEqual([]);
    expect(L.failAttempt(l, ep('run.p9.g0'), 'unknown')).toEqual([]);
    expect(JSON.stringify(l)).toBe(before);
  });

  it('prompt-group granularity: the whole cohort starts over, sealed siblings included; retire what reached Gym', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', 3, 'prompt_group');
    dispatchAll(l);
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('sealed');
    const affected = L.failAttempt(l, ep('run.p0.g1'), 'failed');
    expect(affected.map((s) => s.rollout_id)).toEqual(['run.p0.g0', 'run.p0.g1', 'run.p0.g2']);
    expect(g.siblings.map((s) => s.attempts.map((a) => a.status))).toEqual([
      ['abandoned', 'reserved'],
      ['failed', 'reserved'],
      ['abandoned', 'reserved'],
    ]);
    // The sealed result no longer counts.
    expect(g.siblings[0]!.attempts[0]).toMatchObject({ reward: null, mask_sample: null });
    expect(g.siblings.map((s) => L.siblingKey(s))).toEqual(['run.p0.g0-a1', 'run.p0.g1-a1', 'run.p0.g2-a1']);
    expect(L.attemptsToRetire(affected)).toEqual([ep('run.p0.g0'), ep('run.p0.g1'), ep('run.p0.g2')]);
    // A late result of an abandoned attempt is rejected.
    expect(L.sealAttempt(l, ep('run.p0.g2', 0), 1, false)).toBe('superseded');
  });

  it('attempts that never reached Gym are not retired', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', 2, 'prompt_group');
    L.markDispatched(g, g.siblings[0]!, 'counter_env');
    const affected = L.failAttempt(l, ep('run.p0.g0'), 'failed');
    // g1 was still reserved (never dispatched): nothing to stop in Gym.
    expect(L.attemptsToRetire(affected)).toEqual([ep('run.p0.g0')]);
  });

  it('attempt numbers keep increasing across repeated failures', () => {
    const l = L.emptyLedger('run');
    const g = reserve(l, 'run.p0', 1);
    for (let n = 0; n < 3; n++) {
      dispatchAll(l);
      L.failAttempt(l, ep('run.p0.g0', n), 'failed');
    }
    expect(g.siblings[0]!.attempts.map((a) => a.gym_attempt)).toEqual([0, 1, 2, 3]);
    expect(L.siblingKey(g.siblings[0]!)).toBe('run.p0.g0-a3');
  });
});

describe('ledger: consume', () => {
  it('consumes a ready group (it leaves the ledger) and refuses one that is not ready', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    reserve(l, 'run.p1');
    dispatchAll(l);
    expect(() => L.consumeGroup(l, 'run.p0')).toThrow(/not ready/);
    L.sealAttempt(l, ep('run.p0.g0'), 1, false);
    L.sealAttempt(l, ep('run.p0.g1'), 0, true);
    const g = L.consumeGroup(l, 'run.p0');
    expect(L.rolloutIds(g)).toEqual(['run.p0.g0', 'run.p0.g1']);
    expect(l.groups['run.p0']).toBeUndefined();
    expect(l.order).toEqual(['run.p1']);
    expect(L.readyGroups(l)).toEqual([]);
    expect(() => L.consumeGroup(l, 'run.p0')).toThrow(L.LedgerError);
    // After consumption a late report of the group is unknown, not sealed again.
    expect(L.sealAttempt(l, ep('run.p0.g0'), 1, false)).toBe('unknown');
  });

  it('the ledger is plain JSON (snapshotted as ledger.json, carried across continue-as-new)', () => {
    const l = L.emptyLedger('run');
    reserve(l, 'run.p0');
    dispatchAll(l);
    L.sealAttempt(l, ep('run.p0.g0'), 1, false);
    const copy = JSON.parse(JSON.stringify(l)) as L.Ledger;
    expect(copy).toEqual(l);
    expect(L.sealAttempt(copy, ep('run.p0.g1'), 1, false)).toBe('sealed');
    expect(L.readyGroups(copy)).toHaveLength(1);
    expect(copy.schema_version).toBe(L.LEDGER_SCHEMA_VERSION);
  });
});

describe('recovery transitions', () => {
  const reserveOne = () => {
    const l = L.emptyLedger('run');
    const g = L.reserveGroup(l, {
      group_id: 'g1',
      prompt_id: 'p',
      task_source: 'counter',
      environment: 'counter_env',
      recovery_granularity: 'sibling',
      restore_level: 'turn',
      target_step: 0,
      tasks: [{}, {}],
    });
    L.markDispatched(g, g.siblings[0]!, 'counter_env');
    L.markDispatched(g, g.siblings[1]!, 'counter_env');
    return { l, g };
  };

  it('a restored attempt continues as N+1 on the same server and its lineage keeps attempt N', () => {
    const { l, g } = reserveOne();
    const s = g.siblings[0]!;
    const next = L.continueFromRestore(s, 'counter_env');
    expect(next).toMatchObject({ gym_attempt: 1, status: 'reserved', continued: true, gym_instance_id: 'counter_env' });
    expect(L.lineageKeys(s)).toEqual(['g1.g0', 'g1.g0-a1']);
    // it must go back to the server that owns its saved turn
    expect(() => L.markDispatched(g, s, 'other_env')).toThrow(/must go back/);
    L.markDispatched(g, s, 'counter_env');
    expect(L.sealAttempt(l, { rollout_id: s.rollout_id, attempt: 1 }, 1, false)).toBe('sealed');
    // the dead attempt's late result is refused
    expect(L.sealAttempt(l, { rollout_id: s.rollout_id, attempt: 0 }, 1, false)).toBe('superseded');
  });

  it('a restart from input skips attempt numbers a failed restore already retired, and starts a new lineage', () => {
    const { g } = reserveOne();
    const s = g.siblings[1]!;
    const next = L.restartFromInput(s, 'gym_crash', 1);
    expect(next).toMatchObject({ gym_attempt: 2, continued: false, status: 'reserved' });
    expect(s.attempts[0]!.status).toBe('abandoned');
    expect(L.lineageKeys(s)).toEqual(['g1.g1-a2']);
  });

  it('unsealed siblings are everything not sealed, in reservation order', () => {
    const { l, g } = reserveOne();
    L.sealAttempt(l, { rollout_id: g.siblings[0]!.rollout_id, attempt: 0 }, 0.5, false);
    expect(L.unsealedSiblings(l).map((u) => u.sibling.rollout_id)).toEqual(['g1.g1']);
  });
});
