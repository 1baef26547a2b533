// The rollout deadline registry (workflows/deadlines.ts, controller.md §6): a clock that moves only
// by ticks that fire while nothing holds admission, holders counted, deadlines created while held
// start held, expiry only while running, tick lengths a jittered twentieth of the budget.
import { describe, expect, it } from 'vitest';
import * as D from '../../workflows/deadlines.js';

const S = 1000;

describe('deadline registry', () => {
  it('a deadline runs out once the ticks that fired add up to its budget, not before', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 60 * S);
    expect(D.isRunning(r)).toBe(true);
    expect(D.tick(r, 59 * S)).toBe(false);
    expect(D.expired(r)).toEqual([]);
    expect(D.remainingMs(r, 'a')).toBe(1 * S);
    expect(D.tick(r, 1 * S)).toBe(true);
    expect(D.expired(r)).toEqual(['a']);
    D.removeDeadline(r, 'a');
    expect(D.isEmpty(r)).toBe(true);
    expect(D.tick(r, 60 * S)).toBe(false);
    expect(D.expired(r)).toEqual([]);
  });

  it('a tick that fires while a holder holds counts nothing; after the release ticks count again', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 60 * S);
    D.tick(r, 20 * S);
    D.hold(r, 'gym-checkpoint');
    // Held for a long time: nothing runs out and the clock stands still.
    for (let i = 0; i < 100; i++) expect(D.tick(r, 10 * S)).toBe(false);
    expect(D.expired(r)).toEqual([]);
    expect(D.remainingMs(r, 'a')).toBe(40 * S);
    D.release(r, 'gym-checkpoint');
    expect(D.tick(r, 39 * S)).toBe(false);
    expect(D.tick(r, 1 * S)).toBe(true);
    expect(D.expired(r)).toEqual(['a']);
  });

  it('two overlapping holders: the clock runs again only when the last one releases', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 60 * S);
    D.tick(r, 10 * S);
    D.hold(r, 'weight-sync');
    D.hold(r, 'gym-checkpoint');
    expect(D.holderCount(r)).toBe(2);
    D.release(r, 'gym-checkpoint');
    expect(D.isRunning(r)).toBe(false);
    D.tick(r, 500 * S);
    expect(D.expired(r)).toEqual([]);
    D.release(r, 'weight-sync');
    expect(D.isRunning(r)).toBe(true);
    expect(D.tick(r, 49 * S)).toBe(false);
    expect(D.tick(r, 1 * S)).toBe(true);
  });

  it('the same holder holding twice is counted twice', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S);
    D.hold(r, 'gym-checkpoint');
    D.hold(r, 'gym-checkpoint');
    expect(D.holderCount(r)).toBe(2);
    D.release(r, 'gym-checkpoint');
    expect(D.isRunning(r)).toBe(false);
    D.release(r, 'gym-checkpoint');
    expect(D.isRunning(r)).toBe(true);
    expect(r.holders).toEqual({});
  });

  it('a deadline created while held starts held, with its full budget', () => {
    const r = D.emptyDeadlines();
    D.tick(r, 5 * S);
    D.hold(r, 'gym-checkpoint');
    D.addDeadline(r, 'late', 30 * S);
    D.tick(r, 100 * S);
    expect(D.remainingMs(r, 'late')).toBe(30 * S);
    D.release(r, 'gym-checkpoint');
    expect(D.tick(r, 29 * S)).toBe(false);
    expect(D.tick(r, 1 * S)).toBe(true);
    expect(D.expired(r)).toEqual(['late']);
  });

  it('expiry is reported only while running: a budget that ran out before a hold is listed after the release', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S);
    expect(D.tick(r, 15 * S)).toBe(true);
    D.hold(r, 'gym-checkpoint');
    expect(D.expired(r)).toEqual([]);
    D.release(r, 'gym-checkpoint');
    expect(D.expired(r)).toEqual(['a']);
  });

  it('several deadlines: expiry sorted, each when its own budget has run', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'b', 30 * S);
    D.addDeadline(r, 'a', 30 * S);
    D.tick(r, 10 * S);
    D.addDeadline(r, 'c', 30 * S);
    expect(D.tick(r, 20 * S)).toBe(true);
    expect(D.expired(r)).toEqual(['a', 'b']);
    D.removeDeadline(r, 'a');
    D.removeDeadline(r, 'b');
    expect(D.tick(r, 9 * S)).toBe(false);
    expect(D.tick(r, 1 * S)).toBe(true);
    expect(D.expired(r)).toEqual(['c']);
  });

  it('releasing a holder that does not hold does not go negative or restart other holders’ clocks', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S);
    D.hold(r, 'weight-sync');
    D.release(r, 'gym-checkpoint');
    expect(D.holderCount(r)).toBe(1);
    expect(D.isRunning(r)).toBe(false);
  });

  it('the registry is plain JSON (carried across continue-as-new)', () => {
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 10 * S);
    D.tick(r, 4 * S);
    D.hold(r, 'gym-checkpoint');
    const copy = JSON.parse(JSON.stringify(r)) as D.DeadlineRegistry;
    D.release(copy, 'gym-checkpoint');
    expect(D.tick(copy, 5 * S)).toBe(false);
    expect(D.tick(copy, 1 * S)).toBe(true);
  });

  it('ticks are a twentieth of the budget within [0.1 s, 30 s], jittered to 0.5–1.5 × that', () => {
    expect(D.tickMs(600 * S, 0.5)).toBe(30 * S);
    expect(D.tickMs(600 * S, 0)).toBe(15 * S);
    expect(D.tickMs(600 * S, 0.999)).toBeLessThanOrEqual(45 * S);
    expect(D.tickMs(3600 * S, 0.5)).toBe(D.MAX_TICK_MS);
    expect(D.tickMs(2 * S, 0.5)).toBe(D.MIN_TICK_MS);
    expect(D.tickMs(100 * S, 0.5)).toBe(5 * S);
  });

  it('holds that recur at the tick period stop the clock for about as long as they hold (jittered ticks do not lock onto them)', () => {
    // Held 1 s of every 4 s, with a nominal tick of 4 s: unjittered, every tick would fall in the
    // same phase (all counted or none); jittered, about 3/4 of the time counts.
    const r = D.emptyDeadlines();
    D.addDeadline(r, 'a', 1e12);
    let seed = 42;
    const random = (): number => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    let now = 0;
    while (now < 40_000 * S) {
      const d = D.tickMs(80 * S, random());
      now += d;
      const held = now % (4 * S) < 1 * S;
      if (held) D.hold(r, 'gym-checkpoint');
      D.tick(r, d);
      if (held) D.release(r, 'gym-checkpoint');
    }
    expect(r.elapsedMs / now).toBeGreaterThan(0.7);
    expect(r.elapsedMs / now).toBeLessThan(0.8);
  });
});
