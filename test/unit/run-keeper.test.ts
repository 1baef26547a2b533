// The worker's keeper of `/run`s (activities/run-keeper.ts) against a client whose calls the test
// settles: outcomes through a bounded window in order, beats spaced by the heartbeat timeout,
// cancellation from a beat's answer, "not found" dropped, failed calls sent again, shutdown; a
// result that went to its shard kept for the activity's retry until the server takes it.
import type { Context } from '@temporalio/activity';
import { ActivityCancelledError, ActivityCompletionError, ActivityNotFoundError, type Client } from '@temporalio/client';
import { ApplicationFailure, CompleteAsyncError } from '@temporalio/common';
import { describe, expect, it, vi } from 'vitest';
import { KEPT_RESULT_MS, RunKeeper } from '../../activities/run-keeper.js';
import { sleep, waitFor } from '../helpers/wait.js';

type What = 'complete' | 'fail' | 'cancelled' | 'beat';
type Call = { what: What; token: string; at: number; value?: unknown; settle: (err?: Error) => void };

/** A client whose calls stay open until the test settles them (or at once, with `auto`). */
function fakeClient(auto?: (c: Call) => Error | undefined | 'open') {
  const calls: Call[] = [];
  let open = 0;
  let maxOpen = 0;
  const call = (what: What, token: Uint8Array, value?: unknown) =>
    new Promise<void>((resolve, reject) => {
      open++;
      maxOpen = Math.max(maxOpen, open);
      const c: Call = {
        what,
        token: Buffer.from(token).toString(),
        at: Date.now(),
        value,
        settle: (err) => {
          open--;
          if (err) reject(err);
          else resolve();
        },
      };
      calls.push(c);
      const answer = auto?.(c);
      if (answer !== 'open' && auto) c.settle(answer);
    });
  const client = {
    activity: {
      complete: (token: Uint8Array, result: unknown) => call('complete', token, result),
      fail: (token: Uint8Array, err: unknown) => call('fail', token, err),
      reportCancellation: (token: Uint8Array) => call('cancelled', token),
      heartbeat: (token: Uint8Array) => call('beat', token),
    },
  } as unknown as Client;
  return { client, calls, maxOpen: () => maxOpen };
}

function ctxOf(client: Client | undefined, token: string, heartbeatTimeoutMs: number | undefined = 60_000): Context {
  return {
    get client(): Client {
      if (!client) throw new Error('no client in this activity environment');
      return client;
    },
    info: { taskToken: Buffer.from(token), heartbeatTimeoutMs, isLocal: false },
  } as unknown as Context;
}

const quiet = () => undefined;
/** A `/run` that ends when the test says so (or when its signal aborts). */
function pendingRun() {
  let end!: (v: unknown) => void;
  let seen: AbortSignal | undefined;
  const work = (signal: AbortSignal) =>
    new Promise<unknown>((resolve, reject) => {
      seen = signal;
      end = resolve;
      signal.addEventListener('abort', () => reject(signal.reason));
    });
  return { work, end: (v: unknown) => end(v), signal: () => seen };
}

describe('RunKeeper', () => {
  it('hands the activity over, and sends outcomes in the order the /runs ended, at most `window` calls in flight', async () => {
    const fake = fakeClient();
    const keeper = new RunKeeper({ window: 3, log: quiet });
    for (let i = 0; i < 10; i++) expect(keeper.adopt(ctxOf(fake.client, `t${i}`), {}, async () => ({ n: i }))).toBeInstanceOf(CompleteAsyncError);
    await waitFor('three calls open', () => fake.calls.length === 3);
    expect(keeper.stats()).toMatchObject({ running: 0, queued: 7, inFlight: 3 });
    for (let settled = 0; settled < 10; settled++) {
      await waitFor('an open call', () => fake.calls.length > settled);
      fake.calls[settled]!.settle();
    }
    await keeper.shutdown(1_000);
    expect(fake.maxOpen()).toBe(3);
    expect(fake.calls.map((c) => [c.what, c.token, c.value])).toEqual(Array.from({ length: 10 }, (_, i) => ['complete', `t${i}`, { n: i }]));
    expect(keeper.stats()).toMatchObject({ queued: 0, inFlight: 0, completed: 10, notFound: 0, retried: 0 });
  });

  it('a /run that throws is failed with its error (the server applies the retry policy)', async () => {
    const fake = fakeClient(() => undefined);
    const keeper = new RunKeeper({ log: quiet });
    const refusal = ApplicationFailure.nonRetryable('attempt was retired', 'stale_attempt');
    keeper.adopt(ctxOf(fake.client, 'stale'), {}, () => Promise.reject(refusal));
    await waitFor('the failure', () => fake.calls.length === 1);
    expect(fake.calls[0]).toMatchObject({ what: 'fail', token: 'stale', value: refusal });
    expect(keeper.stats()).toMatchObject({ failed: 1 });
  });

  it('drops an outcome the server no longer wants (not found) and sends a failed call again', async () => {
    const fake = fakeClient();
    const keeper = new RunKeeper({ window: 2, log: quiet });
    keeper.adopt(ctxOf(fake.client, 'gone'), {}, async () => 1);
    keeper.adopt(ctxOf(fake.client, 'busy'), {}, async () => 2);
    await waitFor('two calls', () => fake.calls.length === 2);
    fake.calls[0]!.settle(new ActivityNotFoundError('Not found'));
    fake.calls[1]!.settle(new ActivityCompletionError('context deadline exceeded'));
    await waitFor('the retry', () => fake.calls.length === 3);
    expect(fake.calls[2]).toMatchObject({ what: 'complete', token: 'busy', value: 2 });
    fake.calls[2]!.settle();
    await keeper.shutdown(1_000);
    await sleep(400);
    expect(fake.calls).toHaveLength(3);
    expect(keeper.stats()).toMatchObject({ completed: 1, notFound: 1, retried: 1 });
  });

  it('runs beforeComplete just before the completion, which carries its value; a completion sent again does not run it twice', async () => {
    const fake = fakeClient();
    const keeper = new RunKeeper({ window: 1, log: quiet });
    const before: unknown[] = [];
    let failOnce = true;
    keeper.adopt(ctxOf(fake.client, 'r'), {}, async () => ({ n: 1 }), {
      beforeComplete: async (client, result) => {
        expect(client).toBe(fake.client);
        before.push(result);
        if (failOnce) {
          failOnce = false;
          throw new Error('signal: unavailable');
        }
        return { ...(result as object), reported: true };
      },
    });
    // The first try failed before any completion was sent: sent again after the backoff, with it.
    await waitFor('the completion', () => fake.calls.length === 1);
    expect(fake.calls[0]).toMatchObject({ what: 'complete', token: 'r', value: { n: 1, reported: true } });
    fake.calls[0]!.settle(new ActivityCompletionError('context deadline exceeded'));
    await waitFor('the completion sent again', () => fake.calls.length === 2);
    expect(fake.calls[1]).toMatchObject({ what: 'complete', value: { n: 1, reported: true } });
    fake.calls[1]!.settle();
    await keeper.shutdown(1_000);
    expect(before).toEqual([{ n: 1 }, { n: 1 }]);
    expect(keeper.stats()).toMatchObject({ completed: 1, retried: 2 });
  });

  it('keeps a result that went to its shard until the server takes its completion; a refused one waits for the retry, once', async () => {
    const fake = fakeClient((c) => (c.token === 'refused' ? new ActivityNotFoundError('Not found') : undefined));
    const keeper = new RunKeeper({ log: quiet });
    const reported = async (_client: Client, result: unknown) => ({ ...(result as object), reported: true });
    keeper.adopt(ctxOf(fake.client, 'taken'), {}, async () => ({ n: 1 }), { beforeComplete: reported, keepAs: 'k-taken' });
    keeper.adopt(ctxOf(fake.client, 'refused'), {}, async () => ({ n: 2 }), { beforeComplete: reported, keepAs: 'k-refused' });
    // A failure never went to a shard: nothing to keep.
    keeper.adopt(ctxOf(fake.client, 'failed'), {}, () => Promise.reject(new Error('boom')), { beforeComplete: reported, keepAs: 'k-failed' });
    await waitFor('three outcomes sent', () => fake.calls.length === 3);
    await keeper.shutdown(1_000);
    expect(keeper.stats()).toMatchObject({ completed: 1, failed: 1, notFound: 1, kept: 1 });
    expect(keeper.takeKept('k-taken')).toBeUndefined();
    expect(keeper.takeKept('k-failed')).toBeUndefined();
    expect(keeper.takeKept('k-refused')).toEqual({ n: 2, reported: true });
    expect(keeper.takeKept('k-refused')).toBeUndefined();
    expect(keeper.stats()).toMatchObject({ kept: 0, takenKept: 1 });
  });

  it("a result kept while its completion is still being sent again is the retry's too; a refused one is forgotten after KEPT_RESULT_MS", async () => {
    const fake = fakeClient((c) => (c.token === 'slow' ? 'open' : new ActivityNotFoundError('Not found')));
    const keeper = new RunKeeper({ log: quiet });
    const reported = async (_client: Client, result: unknown) => ({ ...(result as object), reported: true });
    keeper.adopt(ctxOf(fake.client, 'slow'), {}, async () => ({ n: 1 }), { beforeComplete: reported, keepAs: 'k-slow' });
    keeper.adopt(ctxOf(fake.client, 'old'), {}, async () => ({ n: 2 }), { beforeComplete: reported, keepAs: 'k-old' });
    await waitFor('both sent', () => fake.calls.length === 2);
    await waitFor('the refusal', () => keeper.stats().notFound === 1);
    // The server timed the slow try out while its completion was on the way: its retry takes the result.
    expect(keeper.takeKept('k-slow')).toEqual({ n: 1, reported: true });
    const now = Date.now();
    const clock = vi.spyOn(Date, 'now').mockReturnValue(now + KEPT_RESULT_MS + 1);
    try {
      expect(keeper.takeKept('k-old')).toBeUndefined();
    } finally {
      clock.mockRestore();
    }
    fake.calls[0]!.settle(new ActivityNotFoundError('Not found'));
    await keeper.shutdown(1_000);
    expect(keeper.stats()).toMatchObject({ kept: 0, takenKept: 1, notFound: 2 });
  });

  it('beats a held /run once per half to 0.7 of its heartbeat timeout, counted from when each beat went out', async () => {
    const fake = fakeClient(() => undefined);
    const keeper = new RunKeeper({ scanMs: 10, log: quiet });
    const run = pendingRun();
    const adopted = Date.now();
    keeper.adopt(ctxOf(fake.client, 'parked', 400), { captureKey: 'parked' }, run.work);
    await waitFor('three beats', () => fake.calls.length >= 3, 3_000);
    const beats = fake.calls.filter((c) => c.what === 'beat').map((c) => c.at);
    // The first within the first 0.7 of the timeout (its clock started just before the hand-over).
    expect(beats[0]! - adopted).toBeLessThanOrEqual(0.7 * 400 + 30);
    for (let i = 1; i < beats.length; i++) {
      expect(beats[i]! - beats[i - 1]!).toBeGreaterThanOrEqual(0.5 * 400 - 5);
      expect(beats[i]! - beats[i - 1]!).toBeLessThanOrEqual(0.7 * 400 + 40);
    }
    run.end({ ok: true });
    await keeper.shutdown(1_000);
    expect(fake.calls.at(-1)).toMatchObject({ what: 'complete', value: { ok: true } });
  });

  it('a beat answered with a cancellation aborts the /run and reports it cancelled', async () => {
    const fake = fakeClient((c) => (c.what === 'beat' ? new ActivityCancelledError('cancelled') : undefined));
    const keeper = new RunKeeper({ scanMs: 10, log: quiet });
    const run = pendingRun();
    keeper.adopt(ctxOf(fake.client, 'deadline', 200), {}, run.work);
    await waitFor('the cancellation reported', () => fake.calls.some((c) => c.what === 'cancelled'), 3_000);
    expect(run.signal()?.aborted).toBe(true);
    expect(fake.calls.map((c) => c.what)).toEqual(['beat', 'cancelled']);
    expect(keeper.stats()).toMatchObject({ cancelled: 1, running: 0 });
  });

  it('a /run the server no longer has (a beat answered not found) is aborted and nothing more is sent for it', async () => {
    const fake = fakeClient((c) => (c.what === 'beat' ? new ActivityNotFoundError('Not found') : undefined));
    const keeper = new RunKeeper({ scanMs: 10, log: quiet });
    const run = pendingRun();
    keeper.adopt(ctxOf(fake.client, 'timed-out', 200), {}, run.work);
    await waitFor('aborted', () => run.signal()?.aborted === true, 3_000);
    await sleep(300);
    expect(fake.calls.map((c) => c.what)).toEqual(['beat']);
    expect(keeper.stats()).toMatchObject({ notFound: 1, running: 0, queued: 0 });
  });

  it('a queued outcome whose heartbeat deadline is near goes out ahead of the queue', async () => {
    // One call at a time; the first outcome's call stays open, so the others queue.
    const fake = fakeClient((c) => (c.token === 'first' && c.what === 'complete' ? 'open' : undefined));
    const keeper = new RunKeeper({ window: 1, scanMs: 10, log: quiet });
    keeper.adopt(ctxOf(fake.client, 'first'), {}, async () => 0);
    await waitFor('the first call', () => fake.calls.length === 1);
    const late = pendingRun();
    keeper.adopt(ctxOf(fake.client, 'near', 300), {}, late.work);
    keeper.adopt(ctxOf(fake.client, 'other'), {}, async () => 2);
    late.end(1);
    // 'near' is due (and close to its deadline) before 'other', which was queued first, goes out.
    await sleep(250);
    fake.calls[0]!.settle();
    await waitFor('both sent', () => fake.calls.length === 3, 3_000);
    expect(fake.calls.map((c) => c.token)).toEqual(['first', 'near', 'other']);
    expect(fake.calls[1]).toMatchObject({ what: 'complete', value: 1 });
  });

  it('shutdown ends the open /runs and fails them as retryable, so another worker runs them again', async () => {
    const fake = fakeClient(() => undefined);
    const keeper = new RunKeeper({ log: quiet });
    const run = pendingRun();
    keeper.adopt(ctxOf(fake.client, 'open'), {}, run.work);
    await keeper.shutdown(1_000);
    expect(run.signal()?.aborted).toBe(true);
    expect(fake.calls).toHaveLength(1);
    const failure = fake.calls[0]!.value as ApplicationFailure;
    expect(fake.calls[0]!.what).toBe('fail');
    expect(failure).toBeInstanceOf(ApplicationFailure);
    expect(failure.nonRetryable).toBe(false);
    // After shutdown nothing more is adopted: the caller runs the work itself.
    expect(keeper.adopt(ctxOf(fake.client, 'late'), {}, async () => 0)).toBeUndefined();
  });

  it('no client (a mock activity environment) or no heartbeat timeout: the caller runs the /run itself', () => {
    const keeper = new RunKeeper({ log: quiet });
    expect(keeper.adopt(ctxOf(undefined, 'mock'), {}, async () => 0)).toBeUndefined();
    expect(keeper.adopt(ctxOf(fakeClient().client, 'no-timeout', 0), {}, async () => 0)).toBeUndefined();
    expect(keeper.stats()).toMatchObject({ running: 0, queued: 0 });
  });
});
