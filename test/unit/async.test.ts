// servers/common/async.ts. Slots: never more than `limit` at once, a freed slot goes to the next
// waiter in arrival order (no newcomer slips in), and a failing task frees its slot.
import { describe, expect, it } from 'vitest';
import { AdmissionGate, Mutex, Slots, abortedSignal, pause, untilAborted } from '../../servers/common/async.js';
import { sleep } from '../helpers/wait.js';

describe('Slots', () => {
  it('runs at most `limit` tasks at once, in arrival order, and a failure frees its slot', async () => {
    const slots = new Slots(2);
    let running = 0;
    let peak = 0;
    const started: number[] = [];
    const task = (i: number) => async (): Promise<number> => {
      started.push(i);
      peak = Math.max(peak, ++running);
      await sleep(2);
      running--;
      if (i === 3) throw new Error('write failed');
      return i;
    };
    const first = Array.from({ length: 6 }, (_, i) => slots.run(task(i)));
    // Newcomers arriving while slots are being handed over still queue behind the waiters.
    await sleep(3);
    const later = [6, 7].map((i) => slots.run(task(i)));
    const results = await Promise.allSettled([...first, ...later]);
    expect(peak).toBe(2);
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(results.filter((r) => r.status === 'rejected')).toHaveLength(1);
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : 'failed'))).toEqual([0, 1, 2, 'failed', 4, 5, 6, 7]);
  });
});

describe('Mutex', () => {
  it('runs one holder at a time, in arrival order, and a failure releases it', async () => {
    const m = new Mutex();
    const order: string[] = [];
    const hold = (name: string, fail = false) =>
      m.run(async () => {
        order.push(`${name}+`);
        await sleep(2);
        order.push(`${name}-`);
        if (fail) throw new Error(name);
      });
    const done = await Promise.allSettled([hold('a'), hold('b', true), hold('c')]);
    expect(order).toEqual(['a+', 'a-', 'b+', 'b-', 'c+', 'c-']);
    expect(done.map((d) => d.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
  });
});

describe('AdmissionGate and abortable waits', () => {
  it('waiters wake on reopen; an aborted waiter rejects with the reason and leaves the queue', async () => {
    const gate = new AdmissionGate();
    gate.close();
    const ac = new AbortController();
    const woken = gate.wait();
    const aborted = gate.wait(ac.signal);
    ac.abort(new Error('gone'));
    await expect(aborted).rejects.toThrow('gone');
    gate.reopen();
    await expect(woken).resolves.toBeUndefined();
    await expect(gate.wait()).resolves.toBeUndefined();
  });

  it('untilAborted gives the work or the reason; pause ends early on abort and never rejects', async () => {
    const ac = new AbortController();
    await expect(untilAborted(Promise.resolve(7), ac.signal)).resolves.toBe(7);
    const never = untilAborted(new Promise(() => {}), ac.signal);
    const started = Date.now();
    const p = pause(10_000, ac.signal);
    ac.abort(new Error('stop'));
    await expect(never).rejects.toThrow('stop');
    await expect(p).resolves.toBeUndefined();
    await expect(abortedSignal(ac.signal)).rejects.toThrow('stop');
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('Slots.acquire gives up after its timeout and leaves the queue', async () => {
    const s = new Slots(1);
    expect(await s.acquire()).toBe(true);
    expect(await s.acquire(5)).toBe(false);
    expect(s.waiting).toBe(0);
    s.release();
    expect(s.inUse).toBe(0);
  });
});
