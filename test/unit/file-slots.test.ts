// servers/common/file-slots.ts: never more than `limit` at once, a freed slot goes to the next
// waiter in arrival order (no newcomer slips in), and a failing task frees its slot.
import { describe, expect, it } from 'vitest';
import { FileSlots } from '../../servers/common/file-slots.js';

describe('FileSlots', () => {
  it('runs at most `limit` tasks at once, in arrival order, and a failure frees its slot', async () => {
    const slots = new FileSlots(2);
    let running = 0;
    let peak = 0;
    const started: number[] = [];
    const task = (i: number) => async (): Promise<number> => {
      started.push(i);
      peak = Math.max(peak, ++running);
      await new Promise((r) => setTimeout(r, 2));
      running--;
      if (i === 3) throw new Error('write failed');
      return i;
    };
    const first = Array.from({ length: 6 }, (_, i) => slots.run(task(i)));
    // Newcomers arriving while slots are being handed over still queue behind the waiters.
    await new Promise((r) => setTimeout(r, 3));
    const later = [6, 7].map((i) => slots.run(task(i)));
    const results = await Promise.allSettled([...first, ...later]);
    expect(peak).toBe(2);
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(results.filter((r) => r.status === 'rejected')).toHaveLength(1);
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : 'failed'))).toEqual([0, 1, 2, 'failed', 4, 5, 6, 7]);
  });
});
