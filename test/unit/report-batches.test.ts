// Completed reports batched per shard (activities/report-batches.ts) against a client whose
// signals the test records and settles.
import { WorkflowNotFoundError, type Client } from '@temporalio/client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ReportBatches } from '../../activities/report-batches.js';
import type { RolloutReport } from '../../protocol/controller.js';

interface Sent {
  workflowId: string;
  signal: string;
  reports: RolloutReport[];
  settle(err?: Error): void;
}

function recordingClient(): { client: Client; sent: Sent[] } {
  const sent: Sent[] = [];
  const client = {
    withAbortSignal: <R>(_signal: AbortSignal, fn: () => Promise<R>) => fn(),
    workflow: {
      getHandle: (workflowId: string) => ({
        signal: (def: { name: string }, reports: RolloutReport[]) =>
          new Promise<void>((resolve, reject) => sent.push({ workflowId, signal: def.name, reports, settle: (err) => (err ? reject(err) : resolve()) })),
      }),
    },
  } as unknown as Client;
  return { client, sent };
}

const report = (i: number): RolloutReport => ({
  captureKey: `run.s1-p${i}.g0`,
  episode: { rollout_id: `run.s1-p${i}.g0`, attempt: 0 },
  status: 'completed',
  reward: 1,
  terminal: false,
  result: null,
  seconds: 1,
});

describe('report batches', () => {
  afterEach(() => vi.useRealTimers());

  it('sends a lone report at once, then holds what follows until the signal is in and the interval has passed', async () => {
    vi.useFakeTimers();
    const { client, sent } = recordingClient();
    const b = new ReportBatches(client, 200, 100);
    const first = b.deliver('run/shard/0', report(0));
    expect(sent).toHaveLength(1);
    expect(sent[0]!.signal).toBe('rolloutsFinished');
    const later = [1, 2, 3].map((i) => b.deliver('run/shard/0', report(i)));
    const otherShard = b.deliver('run/shard/1', report(9));
    expect(sent.map((s) => s.workflowId)).toEqual(['run/shard/0', 'run/shard/1']);
    sent[0]!.settle();
    await expect(first).resolves.toBe('sent');
    await vi.advanceTimersByTimeAsync(199);
    expect(sent).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(1);
    expect(sent).toHaveLength(3);
    expect(sent[2]!.reports.map((r) => r.captureKey)).toEqual(['run.s1-p1.g0', 'run.s1-p2.g0', 'run.s1-p3.g0']);
    sent[2]!.settle();
    sent[1]!.settle();
    await expect(Promise.all([...later, otherShard])).resolves.toEqual(['sent', 'sent', 'sent', 'sent']);
  });

  it('waits for the signal in flight even past the interval, and caps a batch', async () => {
    vi.useFakeTimers();
    const { client, sent } = recordingClient();
    const b = new ReportBatches(client, 200, 2);
    const all = [0, 1, 2, 3, 4].map((i) => b.deliver('run/shard/0', report(i)));
    await vi.advanceTimersByTimeAsync(1_000);
    expect(sent).toHaveLength(1);
    sent[0]!.settle();
    await vi.advanceTimersByTimeAsync(0);
    expect(sent.map((s) => s.reports.length)).toEqual([1, 2]);
    sent[1]!.settle();
    await vi.advanceTimersByTimeAsync(200);
    expect(sent.map((s) => s.reports.length)).toEqual([1, 2, 2]);
    sent[2]!.settle();
    await expect(Promise.all(all)).resolves.toEqual(['sent', 'sent', 'sent', 'sent', 'sent']);
  });

  it('a shard that is gone leaves every report of the batch to its attempt; any other failure rejects them (sent again)', async () => {
    vi.useFakeTimers();
    const { client, sent } = recordingClient();
    const b = new ReportBatches(client, 200, 100);
    const lone = b.deliver('run/shard/0', report(0));
    const batch = [1, 2].map((i) => b.deliver('run/shard/0', report(i)));
    sent[0]!.settle(new WorkflowNotFoundError('gone', 'run/shard/0', undefined));
    await expect(lone).resolves.toBe('not_found');
    await vi.advanceTimersByTimeAsync(200);
    sent[1]!.settle(new Error('ResourceExhausted'));
    await expect(Promise.all(batch.map((p) => p.catch((e: Error) => e.message)))).resolves.toEqual(['ResourceExhausted', 'ResourceExhausted']);
    // Sent again, it goes in a new batch.
    await vi.advanceTimersByTimeAsync(200);
    const again = b.deliver('run/shard/0', report(1));
    expect(sent).toHaveLength(3);
    sent[2]!.settle();
    await expect(again).resolves.toBe('sent');
  });
});
