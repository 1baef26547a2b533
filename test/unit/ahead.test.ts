// Records staged ahead of a checkpoint (servers/control/ahead.ts): the steady rule, the slices,
// and giving way the moment a checkpoint opens.
import { describe, expect, it, vi } from 'vitest';
import { AheadStaging, SteadyObjects } from '../../servers/control/ahead.js';

/** Busy-waits `ms`: one unit of staging that takes time. */
function spin(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end);
}

describe('SteadyObjects', () => {
  it('calls an object steady from the second scan that sees it on', () => {
    const steady = new SteadyObjects();
    const a = {};
    expect(steady.steady(a)).toBe(false);
    expect(steady.steady(a)).toBe(true);
    expect(steady.steady(a)).toBe(true);
    expect(steady.steady({})).toBe(false);
  });
});

describe('AheadStaging', () => {
  it('runs the whole staging while idle, in slices, and not at all while a checkpoint is open', async () => {
    let idle = false;
    let done = 0;
    const stage = function* () {
      for (let i = 0; i < 20; i++) {
        spin(1);
        done += 1;
        yield;
      }
    };
    const turns = vi.fn();
    const ahead = new AheadStaging({ stage, idle: () => idle, scanMs: 60_000, sliceMs: 3 });
    try {
      await ahead.scan();
      expect(done).toBe(0);
      idle = true;
      const interval = setInterval(turns, 0);
      await ahead.scan();
      clearInterval(interval);
      expect(done).toBe(20);
      expect(turns.mock.calls.length).toBeGreaterThan(0); // the event loop turned between slices
    } finally {
      ahead.stop();
    }
  });

  it('gives way between slices when a checkpoint opens, and the next scan starts over', async () => {
    let idle = true;
    let done = 0;
    const stage = function* () {
      for (let i = 0; i < 50; i++) {
        spin(1);
        done += 1;
        if (done === 5) idle = false; // prepare closed admission during the slice
        yield;
      }
    };
    const ahead = new AheadStaging({ stage, idle: () => idle, scanMs: 60_000, sliceMs: 3 });
    try {
      await ahead.scan();
      expect(done).toBeGreaterThanOrEqual(5);
      expect(done).toBeLessThan(50);
      const stoppedAt = done;
      await ahead.scan();
      expect(done).toBe(stoppedAt);
    } finally {
      ahead.stop();
    }
  });

  it('logs a staging that throws and scans again later', async () => {
    const log = vi.fn();
    let calls = 0;
    const stage = function* () {
      calls += 1;
      yield;
      throw new Error('boom');
    };
    const ahead = new AheadStaging({ stage, idle: () => true, scanMs: 60_000, log });
    try {
      await ahead.scan();
      await ahead.scan();
      expect(calls).toBe(2);
      expect(log).toHaveBeenCalledTimes(2);
      expect(String(log.mock.calls[0]![1])).toContain('boom');
    } finally {
      ahead.stop();
    }
  });
});
