// A `/run`'s request body owns its bytes: a `/run` may stay parked for minutes, and a body that were
// a slice of Node's shared 8 KB buffer pool (what undici makes of a string) would keep the whole
// slab alive with it, ~7.5 KB too many per parked rollout (docs/performance.md). And a retry whose
// earlier try's report reached its shard completes with that report, without a `/run`: kept by this
// worker's run keeper, or, when that try's worker died, as the shard sealed it.
import type { Context } from '@temporalio/activity';
import { ActivityNotFoundError, type Client } from '@temporalio/client';
import { MockActivityEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { MockAgent } from 'undici';
import { describe, expect, it } from 'vitest';
import { createRolloutActivities } from '../../activities/rollouts.js';
import { RunKeeper } from '../../activities/run-keeper.js';
import { waitFor } from '../helpers/wait.js';
import { mockEnv } from '../helpers/activity.js';

/** One episode's `/run` input, to an address the mock agent answers (nothing reaches the network). */
const INPUT = {
  run: 'r',
  environment: 'weather_env',
  environmentUrl: 'http://127.0.0.1:9',
  episode: { rollout_id: 'r-p0-s0', attempt: 1 },
  task: { prompt: 'x' },
};

describe('runEpisode', () => {
  it('sends its body as bytes of their own, the JSON of the episode and its task', async () => {
    const agent = new MockAgent();
    agent.disableNetConnect();
    let sent: unknown;
    agent
      .get('http://127.0.0.1:9')
      .intercept({ path: '/run', method: 'POST' })
      .reply(409, (opts) => {
        sent = opts.body;
        return { code: 'stale_attempt', message: 'retired' };
      });
    try {
      await expect(mockEnv().run(createRolloutActivities(agent).runEpisode, INPUT)).rejects.toThrow(/stale_attempt|retired/);
    } finally {
      await agent.close();
    }
    expect(sent).toBeInstanceOf(Uint8Array);
    const bytes = sent as Uint8Array;
    expect(bytes.buffer.byteLength).toBe(bytes.byteLength);
    expect(JSON.parse(new TextDecoder().decode(bytes))).toEqual({ episode_id: { rollout_id: 'r-p0-s0', attempt: 1 }, task: { prompt: 'x' } });
  });

  it("a retry whose earlier try's completed report reached its shard (its completion refused) returns that report and calls no /run", async () => {
    const keeper = new RunKeeper({ log: () => undefined });
    const report = {
      captureKey: 'r-p0-s0-a1',
      episode: { rollout_id: 'r-p0-s0', attempt: 1 },
      status: 'completed',
      reward: 1,
      terminal: false,
      result: { reward: 1 },
      seconds: 5,
    };
    // The earlier try, as the keeper ran it: its report was signalled, then the server refused the
    // completion (it had timed the try out while it was unreachable).
    const client = { activity: { complete: () => Promise.reject(new ActivityNotFoundError('Not found')) } } as unknown as Client;
    const ctx = { client, info: { taskToken: Buffer.from('t1'), heartbeatTimeoutMs: 10_000, isLocal: false } } as unknown as Context;
    keeper.adopt(ctx, {}, async () => report, { beforeComplete: async (_c, r) => ({ ...(r as object), reported: true }), keepAs: 'r-p0-s0-a1' });
    await waitFor('the refusal', () => keeper.stats().notFound === 1);
    const agent = new MockAgent();
    agent.disableNetConnect();
    const input = { ...INPUT, reportTo: 'r/shard/0' };
    try {
      expect(await mockEnv().run(createRolloutActivities(agent, keeper).runEpisode, input)).toEqual({ ...report, reported: true });
    } finally {
      await agent.close();
    }
    expect(keeper.stats()).toMatchObject({ kept: 0, takenKept: 1 });
  });

  /** A worker client whose shard answers the `sealedAttempt` query with `answer`; `asked` records the questions. */
  function shardAnswering(answer: unknown, asked: unknown[]): Client {
    const query = async (def: { name: string }, episode: unknown) => {
      asked.push({ query: def.name, episode });
      if (answer instanceof Error) throw answer;
      return answer;
    };
    return {
      workflow: {
        getHandle: (id: string) => {
          asked.push({ handle: id });
          return { query };
        },
      },
      // The SDK runs every activity inside its client's abort-signal scope.
      withAbortSignal: (_signal: AbortSignal, fn: () => unknown) => fn(),
    } as unknown as Client;
  }
  const envOf = (tryNumber: number, client: Client) =>
    new MockActivityEnvironment({ attempt: tryNumber, heartbeatTimeoutMs: 10_000 }, { client, logger: new DefaultLogger('ERROR') });

  it("a retry whose earlier try's worker died after the report sealed the attempt completes with the shard's outcome and calls no /run", async () => {
    const asked: unknown[] = [];
    const agent = new MockAgent();
    agent.disableNetConnect();
    try {
      const input = { ...INPUT, reportTo: 'r/shard/0' };
      const r = await envOf(3, shardAnswering({ reward: 0.5, mask_sample: false }, asked)).run(createRolloutActivities(agent).runEpisode, input);
      expect(r).toMatchObject({
        captureKey: 'r-p0-s0-a1',
        episode: { rollout_id: 'r-p0-s0', attempt: 1 },
        status: 'completed',
        reward: 0.5,
        terminal: false,
        result: { reward: 0.5, mask_sample: false },
        reported: true,
      });
    } finally {
      await agent.close();
    }
    expect(asked).toEqual([{ handle: 'r/shard/0' }, { query: 'sealedAttempt', episode: { rollout_id: 'r-p0-s0', attempt: 1 } }]);
  });

  it('a first try never asks its shard; a retry the shard has not sealed (or that cannot ask) runs /run', async () => {
    for (const [tryNumber, answer] of [
      [1, { reward: 1, mask_sample: false }],
      [2, null],
      [2, new Error('query timed out')],
    ] as const) {
      const asked: unknown[] = [];
      const agent = new MockAgent();
      agent.disableNetConnect();
      agent.get('http://127.0.0.1:9').intercept({ path: '/run', method: 'POST' }).reply(409, { code: 'stale_attempt', message: 'retired' });
      try {
        const input = { ...INPUT, reportTo: 'r/shard/0' };
        await expect(envOf(tryNumber, shardAnswering(answer, asked)).run(createRolloutActivities(agent).runEpisode, input)).rejects.toThrow(/stale_attempt/);
      } finally {
        await agent.close();
      }
      expect(asked.length).toBe(tryNumber === 1 ? 0 : 2);
    }
  });
});
