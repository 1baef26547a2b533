import type { Context } from '@temporalio/activity';
import { ActivityCancelledError, ActivityCompletionError, ActivityNotFoundError, type Client } from '@temporalio/client';
import { CompleteAsyncError } from '@temporalio/common';
import { describe, expect, it } from 'vitest';
import { CompletionWindow } from '../../activities/completion-window.js';
import { sleep, waitFor } from '../helpers/wait.js';

type Call = { what: 'complete' | 'beat'; token: string; result?: unknown; settle: (err?: Error) => void };

/** A client whose calls stay open until the test settles them. */
function fakeClient() {
  const calls: Call[] = [];
  let open = 0;
  let maxOpen = 0;
  const call = (what: Call['what'], token: Uint8Array, result?: unknown) =>
    new Promise<void>((resolve, reject) => {
      open++;
      maxOpen = Math.max(maxOpen, open);
      calls.push({
        what,
        token: Buffer.from(token).toString(),
        result,
        settle: (err) => {
          open--;
          if (err) reject(err);
          else resolve();
        },
      });
    });
  const client = {
    activity: {
      complete: (token: Uint8Array, result: unknown) => call('complete', token, result),
      heartbeat: (token: Uint8Array) => call('beat', token),
    },
  } as unknown as Client;
  return { client, calls, maxOpen: () => maxOpen };
}

function ctxOf(client: Client | undefined, token: string, heartbeatTimeoutMs?: number): Context {
  return {
    get client(): Client {
      if (!client) throw new Error('no client in this activity environment');
      return client;
    },
    info: { taskToken: Buffer.from(token), heartbeatTimeoutMs, isLocal: false },
  } as unknown as Context;
}

const quiet = () => undefined;

describe('CompletionWindow', () => {
  it('keeps at most `limit` completion calls in flight and sends them in the order handed over', async () => {
    const fake = fakeClient();
    const window = new CompletionWindow({ limit: 3, log: quiet });
    for (let i = 0; i < 10; i++) expect(window.handOver(ctxOf(fake.client, `t${i}`), { n: i })).toBeInstanceOf(CompleteAsyncError);
    expect(fake.calls).toHaveLength(3);
    expect(window.stats()).toMatchObject({ queued: 7, inFlight: 3 });
    // Settle whatever is open until every completion went out.
    for (let settled = 0; settled < 10; settled++) {
      await waitFor('an open call', () => fake.calls.length > settled);
      fake.calls[settled]!.settle();
    }
    await window.drain(1_000);
    expect(fake.maxOpen()).toBe(3);
    expect(fake.calls.map((c) => c.token)).toEqual(Array.from({ length: 10 }, (_, i) => `t${i}`));
    expect(fake.calls.map((c) => c.result)).toEqual(Array.from({ length: 10 }, (_, i) => ({ n: i })));
    expect(window.stats()).toMatchObject({ queued: 0, inFlight: 0, completed: 10, notFound: 0, retried: 0 });
  });

  it('drops a completion the server no longer wants (not found) and sends a failed one again', async () => {
    const fake = fakeClient();
    const window = new CompletionWindow({ limit: 2, log: quiet });
    window.handOver(ctxOf(fake.client, 'gone'), 1);
    window.handOver(ctxOf(fake.client, 'busy'), 2);
    fake.calls[0]!.settle(new ActivityNotFoundError('Not found'));
    fake.calls[1]!.settle(new ActivityCompletionError('context deadline exceeded'));
    // The failed one comes back after its backoff, the dropped one never.
    await waitFor('the retry', () => fake.calls.length === 3);
    expect(fake.calls[2]).toMatchObject({ what: 'complete', token: 'busy', result: 2 });
    fake.calls[2]!.settle();
    await window.drain(1_000);
    expect(window.stats()).toMatchObject({ queued: 0, inFlight: 0, completed: 1, notFound: 1, retried: 1 });
  });

  it('heartbeats a queued completion before its heartbeat timeout, ahead of the completions waiting', async () => {
    const fake = fakeClient();
    const window = new CompletionWindow({ limit: 1, beatScanMs: 20, log: quiet });
    window.handOver(ctxOf(fake.client, 'first', 10_000), 'a');
    window.handOver(ctxOf(fake.client, 'waiting', 100), 'b');
    await sleep(120);
    // The one slot is taken by the first completion: the beat goes out when it frees, before 'waiting' completes.
    expect(fake.calls.map((c) => `${c.what}:${c.token}`)).toEqual(['complete:first']);
    fake.calls[0]!.settle();
    await waitFor('the beat', () => fake.calls.length === 2);
    expect(fake.calls[1]).toMatchObject({ what: 'beat', token: 'waiting' });
    // Cancellation requested meanwhile: the reply still completes the activity.
    fake.calls[1]!.settle(new ActivityCancelledError('cancelled'));
    await waitFor('the completion', () => fake.calls.length === 3);
    expect(fake.calls[2]).toMatchObject({ what: 'complete', token: 'waiting', result: 'b' });
    fake.calls[2]!.settle();
    await window.drain(1_000);
    expect(window.stats().completed).toBe(2);
  });

  it('leaves the completion to the SDK where the activity has no client (a mock activity environment)', () => {
    const window = new CompletionWindow({ log: quiet });
    expect(window.handOver(ctxOf(undefined, 't'), 1)).toBeUndefined();
    expect(window.stats()).toMatchObject({ queued: 0, inFlight: 0 });
  });

  it('refuses a limit that is not a positive integer', () => {
    expect(() => new CompletionWindow({ limit: 0 })).toThrow(/positive integer/);
  });
});
