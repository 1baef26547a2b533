// The environment server's small parts without HTTP: final cleanup (newest-first, each once, one
// timeout, a failed close retried once), the kept `/run` replies of our idempotent extension, and
// the concurrency slots.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { AttemptReplies, type FinishedRun, type RunOutcome } from '../../servers/environment/attempt-replies.js';
import { CleanupStack } from '../../servers/environment/cleanup-stack.js';
import { Slots } from '../../servers/common/async.js';
import { isRetryableDependencyError } from '../../servers/environment/failures.js';
import { PeerHttpError } from '../../servers/common/http-client.js';

afterEach(() => {
  vi.useRealTimers();
});

describe('CleanupStack', () => {
  it('unwinds newest-first, each callback once, and keeps going after a failure', async () => {
    const order: string[] = [];
    const log = vi.fn();
    const stack = new CleanupStack(1_000, log);
    stack.register('resources', async () => void order.push('resources'));
    const agent = stack.register('agent', async () => void order.push('agent'));
    stack.register('broken', async () => {
      order.push('broken');
      throw new Error('nope');
    });
    await agent.close(); // closed during the protocol: not again at the end
    await stack.unwind();
    expect(order).toEqual(['agent', 'broken', 'resources']);
    expect(log).toHaveBeenCalledWith('episode cleanup failed: broken', expect.any(Error));
    await stack.unwind();
    expect(order).toEqual(['agent', 'broken', 'resources', 'broken']);
  });

  it('a close that failed is retried once by a later registration that closes it', async () => {
    let calls = 0;
    const stack = new CleanupStack(1_000);
    const resources = stack.register('resources', async () => {
      calls += 1;
      if (calls === 1) throw new Error('transient');
    });
    stack.register('post-verification', (signal) => resources.close(signal));
    await stack.unwind();
    // post-verification failed (first call), then the resources entry itself retried and succeeded.
    expect(calls).toBe(2);
    expect(resources.pending).toBe(false);
  });

  it('the whole unwind is bounded by the cleanup timeout', async () => {
    const stack = new CleanupStack(50);
    const seen: boolean[] = [];
    stack.register('never', () => new Promise(() => undefined));
    stack.register('hangs', (signal) => new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason))));
    const t = Date.now();
    await stack.unwind();
    seen.push(true);
    expect(Date.now() - t).toBeLessThan(1_000);
    expect(seen).toEqual([true]);
  });

  it('a close during the protocol stops with the episode signal and stays pending', async () => {
    const stack = new CleanupStack(5_000);
    let finish: (() => void) | undefined;
    const h = stack.register(
      'agent',
      (signal) =>
        new Promise<void>((resolve, reject) => {
          finish = resolve;
          signal.addEventListener('abort', () => reject(signal.reason));
        }),
    );
    const ac = new AbortController();
    const closing = h.close(ac.signal);
    ac.abort(new Error('retired'));
    await expect(closing).rejects.toThrow('retired');
    expect(h.pending).toBe(true);
    const final = h.close();
    finish!();
    await final;
    expect(h.pending).toBe(false);
  });

  it('a close during the protocol is not cut by the cleanup timeout: only the episode signal bounds it', async () => {
    const stack = new CleanupStack(20);
    const h = stack.register('agent', () => new Promise<void>((resolve) => setTimeout(resolve, 150)));
    await h.close(new AbortController().signal);
    expect(h.pending).toBe(false);
    // Final cleanup (no episode signal) is bounded by it.
    const slow = stack.register('slow', () => new Promise<void>((resolve) => setTimeout(resolve, 150)));
    await expect(slow.close()).rejects.toThrow();
    expect(slow.pending).toBe(true);
  });

  it('concurrent closes of one entry run the callback once', async () => {
    const stack = new CleanupStack(1_000);
    let calls = 0;
    let release!: () => void;
    const h = stack.register('x', () => {
      calls += 1;
      return new Promise<void>((r) => (release = r));
    });
    const a = h.close();
    const b = h.close();
    release();
    await Promise.all([a, b]);
    expect(calls).toBe(1);
  });
});

describe('AttemptReplies', () => {
  const outcome = (n: number): RunOutcome => ({ status: 200, body: { n } });

  it('joins a running attempt, keeps its reply, and forgets it by rollout', async () => {
    const r = new AttemptReplies();
    let finish!: (f: FinishedRun) => void;
    const work = vi.fn(() => new Promise<FinishedRun>((res) => (finish = res)));
    const first = r.start('wx', 'd', work);
    const found = r.lookup('wx');
    expect(found?.kind).toBe('running');
    expect(() => r.start('wx', 'd', work)).toThrow();
    finish({ outcome: outcome(1), keep: true });
    expect(await first).toEqual(outcome(1));
    expect(await (found as { reply: Promise<RunOutcome> }).reply).toEqual(outcome(1));
    expect(r.lookup('wx')).toEqual({ kind: 'kept', digest: 'd', reply: outcome(1) });
    expect(work).toHaveBeenCalledTimes(1);
    await r.start('wx-a1', 'd', async () => ({ outcome: outcome(2), keep: true }));
    await r.start('other', 'd', async () => ({ outcome: outcome(3), keep: true }));
    r.forget(['wx']);
    expect(r.lookup('wx')).toBeUndefined();
    expect(r.lookup('wx-a1')).toBeUndefined();
    expect(r.lookup('other')?.kind).toBe('kept');
  });

  it('does not keep refusals (a retry must be able to run)', async () => {
    const r = new AttemptReplies();
    await r.start('x', 'd', async () => ({ outcome: { status: 409, body: {} }, keep: false }));
    expect(r.lookup('x')).toBeUndefined();
    await expect(r.start('y', 'd', async () => Promise.reject(new Error('bug')))).rejects.toThrow('bug');
    expect(r.lookup('y')).toBeUndefined();
  });

  it('evicts the oldest kept reply beyond the cap, leaving a tombstone until forget', async () => {
    const onEvict = vi.fn();
    const r = new AttemptReplies({ maxKept: 2, maxTombstones: 1, onEvict });
    for (const k of ['a', 'b', 'c']) await r.start(k, 'd', async () => ({ outcome: outcome(0), keep: true }));
    expect(onEvict).toHaveBeenCalledWith('a');
    expect(r.lookup('a')).toEqual({ kind: 'evicted' });
    expect(r.keptCount).toBe(2);
    await r.start('e', 'd', async () => ({ outcome: outcome(0), keep: true }));
    // Tombstones are capped too (oldest first).
    expect(r.lookup('a')).toBeUndefined();
    expect(r.lookup('b')).toEqual({ kind: 'evicted' });
    r.forget(['b']);
    expect(r.lookup('b')).toBeUndefined();
  });
});

describe('Slots', () => {
  it('grants in FIFO order and gives up after the queue timeout', async () => {
    vi.useFakeTimers();
    const s = new Slots(1);
    expect(await s.acquire(100)).toBe(true);
    const second = s.acquire(100);
    const third = s.acquire(null);
    vi.advanceTimersByTime(100);
    expect(await second).toBe(false);
    s.release();
    expect(await third).toBe(true);
    expect(s.inUse).toBe(1);
    s.release();
    expect(s.inUse).toBe(0);
  });
});

describe('terminal flag', () => {
  it('retryable: 408/425/429/5xx, connection and timeout errors; terminal otherwise', () => {
    for (const status of [408, 425, 429, 500, 503]) expect(isRetryableDependencyError(new PeerHttpError('u', status, ''))).toBe(true);
    for (const status of [400, 404, 409, 422]) expect(isRetryableDependencyError(new PeerHttpError('u', status, ''))).toBe(false);
    expect(isRetryableDependencyError(Object.assign(new Error('x'), { code: 'ECONNREFUSED' }))).toBe(true);
    expect(isRetryableDependencyError(new TypeError('fetch failed', { cause: Object.assign(new Error('y'), { code: 'UND_ERR_SOCKET' }) }))).toBe(true);
    // Out of descriptors or ports while connecting: a connection error, retryable.
    for (const code of ['EMFILE', 'ENFILE', 'EADDRNOTAVAIL']) {
      expect(isRetryableDependencyError(new TypeError('fetch failed', { cause: Object.assign(new Error(`connect ${code} 127.0.0.1:1`), { code }) }))).toBe(
        true,
      );
    }
    expect(isRetryableDependencyError(Object.assign(new Error('no'), { code: 'EACCES' }))).toBe(false);
    expect(isRetryableDependencyError(new Error('Agent seed returned a different agent_session_id'))).toBe(false);
  });
});
