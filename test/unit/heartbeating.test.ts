import { MockActivityEnvironment } from '@temporalio/testing';
import { describe, expect, it } from 'vitest';
import { beatEvery, HEARTBEAT_INTERVAL_MS, heartbeating } from '../../activities/activity-context.js';
import { sleep } from '../helpers/wait.js';

describe('heartbeating', () => {
  it('sends nothing for a call that ends within one interval', async () => {
    const env = new MockActivityEnvironment();
    const beats: unknown[] = [];
    env.on('heartbeat', (d: unknown) => beats.push(d));
    expect(await env.run(() => heartbeating({ op: 'quick' }, async () => 'done', 200))).toBe('done');
    await sleep(300);
    expect(beats).toEqual([]);
  });

  it('beats every interval while a long call runs, and stops when it ends', async () => {
    const env = new MockActivityEnvironment();
    const beats: unknown[] = [];
    env.on('heartbeat', (d: unknown) => beats.push(d));
    await env.run(() => heartbeating({ op: 'long' }, () => sleep(230), 50));
    expect(beats.length).toBeGreaterThanOrEqual(3);
    expect(beats.length).toBeLessThanOrEqual(5);
    expect(beats.every((d) => JSON.stringify(d) === '{"op":"long"}')).toBe(true);
    const n = beats.length;
    await sleep(150);
    expect(beats).toHaveLength(n);
  });

  it('a local activity sends no heartbeat (it cannot) and still turns a cancellation into the cancellation', async () => {
    const env = new MockActivityEnvironment({ isLocal: true });
    const beats: unknown[] = [];
    env.on('heartbeat', (d: unknown) => beats.push(d));
    expect(await env.run(() => heartbeating({ op: 'local' }, async () => sleep(180).then(() => 'done'), 50))).toBe('done');
    expect(beats).toEqual([]);
    const cancelled = new MockActivityEnvironment({ isLocal: true });
    const run = cancelled.run(() =>
      heartbeating({ op: 'local' }, (signal) => new Promise((_, reject) => signal!.addEventListener('abort', () => reject(new Error('aborted request')))), 50),
    );
    setTimeout(() => cancelled.cancel('CANCELLED'), 20);
    await expect(run).rejects.toMatchObject({ name: 'CancelledFailure' });
  });

  it('turns what the call threw into the cancellation once the activity is cancelled', async () => {
    const env = new MockActivityEnvironment();
    const run = env.run(() =>
      heartbeating(
        { op: 'cancelled' },
        (signal) => new Promise((_, reject) => signal!.addEventListener('abort', () => reject(new Error('aborted request')))),
        50,
      ),
    );
    setTimeout(() => env.cancel('CANCELLED'), 20);
    await expect(run).rejects.toMatchObject({ name: 'CancelledFailure' });
  });

  it('beats every quarter of a long heartbeat timeout, never less often than every half of a short one', () => {
    expect(beatEvery(undefined)).toBe(HEARTBEAT_INTERVAL_MS);
    expect(beatEvery(120_000)).toBe(30_000);
    expect(beatEvery(15_000)).toBe(HEARTBEAT_INTERVAL_MS);
    expect(beatEvery(4_000)).toBe(2_000);
    // Within the SDK's throttle window (0.8 × the timeout) for every timeout.
    for (const t of [1_000, 6_000, 20_000, 600_000]) expect(beatEvery(t)).toBeLessThan(0.8 * t);
  });
});
