// The rollout deadline registry (workflows/deadlines.ts, controller.md §6): budgets banked while
// any holder holds admission, holders counted, deadlines created while held start held, expiry
// only while the clocks run.
import { describe, expect, it } from 'vitest';
import * as D from '../../workflows/deadlines.js';

const S = 1000;

describe('deadline registry', () => {
  it('a deadline expires when its budget has run out, not before', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 60 * S, 0);
    expect(D.isRunning(r)).toBe(true);
    expect(D.expired(r, 59 * S)).toEqual([]);
    expect(D.nextExpiryMs(r, 59 * S)).toBe(1 * S);
    expect(D.expired(r, 60 * S)).toEqual(['a']);
    expect(D.nextExpiryMs(r, 70 * S)).toBe(0);
    D.removeDeadline(r, 'a');
    expect(D.expired(r, 120 * S)).toEqual([]);
    expect(D.nextExpiryMs(r, 120 * S)).toBeUndefined();
  });

  it('holding banks the remaining budget; releasing restarts the clock with it', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 60 * S, 0);
    D.hold(r, 'gym-checkpoint', 20 * S);
    expect(r.entries.a).toEqual({ bankedMs: 40 * S, runningSince: null });
    // Held for a long time: nothing expires and nothing is scheduled.
    expect(D.expired(r, 1_000 * S)).toEqual([]);
    expect(D.nextExpiryMs(r, 1_000 * S)).toBeUndefined();
    expect(D.remainingMs(r.entries.a!, 1_000 * S)).toBe(40 * S);
    D.release(r, 'gym-checkpoint', 1_000 * S);
    expect(D.nextExpiryMs(r, 1_000 * S)).toBe(40 * S);
    expect(D.expired(r, 1_039 * S)).toEqual([]);
    expect(D.expired(r, 1_040 * S)).toEqual(['a']);
  });

  it('two overlapping holders: the clocks restart only when the last one releases', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 60 * S, 0);
    D.hold(r, 'weight-sync', 10 * S); // a: 50 s banked
    D.hold(r, 'gym-checkpoint', 20 * S); // second holder: must not re-bank (still 50 s)
    expect(D.holderCount(r)).toBe(2);
    expect(r.entries.a!.bankedMs).toBe(50 * S);
    // The checkpoint ends while the weight sync still holds: clocks stay stopped.
    D.release(r, 'gym-checkpoint', 30 * S);
    expect(D.isRunning(r)).toBe(false);
    expect(D.expired(r, 500 * S)).toEqual([]);
    expect(r.entries.a!.runningSince).toBeNull();
    D.release(r, 'weight-sync', 500 * S);
    expect(D.isRunning(r)).toBe(true);
    expect(D.expired(r, 549 * S)).toEqual([]);
    expect(D.expired(r, 550 * S)).toEqual(['a']);
  });

  it('the same holder holding twice is counted twice', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S, 0);
    D.hold(r, 'gym-checkpoint', 1 * S);
    D.hold(r, 'gym-checkpoint', 2 * S);
    expect(D.holderCount(r)).toBe(2);
    D.release(r, 'gym-checkpoint', 3 * S);
    expect(D.isRunning(r)).toBe(false);
    D.release(r, 'gym-checkpoint', 4 * S);
    expect(D.isRunning(r)).toBe(true);
    expect(r.holders).toEqual({});
    expect(D.remainingMs(r.entries.a!, 4 * S)).toBe(9 * S);
  });

  it('a deadline created while held starts held, with its full budget', () => {
    const r = D.emptyDeadlines();
    D.hold(r, 'gym-checkpoint', 0);
    D.addDeadline(r, 'late', 30 * S, 5 * S);
    expect(r.entries.late).toEqual({ bankedMs: 30 * S, runningSince: null });
    expect(D.expired(r, 100 * S)).toEqual([]);
    D.release(r, 'gym-checkpoint', 100 * S);
    expect(D.expired(r, 129 * S)).toEqual([]);
    expect(D.expired(r, 130 * S)).toEqual(['late']);
  });

  it('expiry happens only while running: an overdue budget banked at hold does not fire until release', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S, 0);
    // The checkpoint closes the gate after the budget already ran out (no wake-up in between).
    D.hold(r, 'gym-checkpoint', 15 * S);
    expect(r.entries.a!.bankedMs).toBe(-5 * S);
    expect(D.expired(r, 15 * S)).toEqual([]);
    D.release(r, 'gym-checkpoint', 20 * S);
    expect(D.expired(r, 20 * S)).toEqual(['a']);
    expect(D.nextExpiryMs(r, 20 * S)).toBe(0);
  });

  it('several deadlines: sorted expiry, the nearest one schedules the wake-up', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'b', 30 * S, 0);
    D.addDeadline(r, 'a', 30 * S, 0);
    D.addDeadline(r, 'c', 90 * S, 0);
    expect(D.nextExpiryMs(r, 10 * S)).toBe(20 * S);
    expect(D.expired(r, 30 * S)).toEqual(['a', 'b']);
    D.removeDeadline(r, 'a');
    D.removeDeadline(r, 'b');
    expect(D.nextExpiryMs(r, 30 * S)).toBe(60 * S);
  });

  it('releasing a holder that does not hold does not go negative or restart other holders’ clocks', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S, 0);
    D.hold(r, 'weight-sync', 1 * S);
    D.release(r, 'gym-checkpoint', 2 * S);
    expect(D.holderCount(r)).toBe(1);
    expect(D.isRunning(r)).toBe(false);
  });

  it('the registry is plain JSON (carried across continue-as-new)', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S, 0);
    D.hold(r, 'gym-checkpoint', 4 * S);
    const copy = JSON.parse(JSON.stringify(r)) as D.DeadlineRegistry;
    D.release(copy, 'gym-checkpoint', 100 * S);
    expect(D.expired(copy, 105 * S)).toEqual([]);
    expect(D.expired(copy, 106 * S)).toEqual(['a']);
  });
});
