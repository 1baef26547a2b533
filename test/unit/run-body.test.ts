// A `/run`'s request body owns its bytes: a `/run` may stay parked for minutes, and a body that were
// a slice of Node's shared 8 KB buffer pool (what undici makes of a string) would keep the whole
// slab alive with it, ~7.5 KB too many per parked rollout (docs/performance.md).
import { MockAgent } from 'undici';
import { describe, expect, it } from 'vitest';
import { createRolloutActivities } from '../../activities/rollouts.js';
import { mockEnv } from '../helpers/activity.js';

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
    const input = {
      run: 'r',
      environment: 'weather_env',
      environmentUrl: 'http://127.0.0.1:9',
      episode: { rollout_id: 'r-p0-s0', attempt: 1 },
      task: { prompt: 'x' },
    };
    try {
      await expect(mockEnv().run(createRolloutActivities(agent).runEpisode, input)).rejects.toThrow(/stale_attempt|retired/);
    } finally {
      await agent.close();
    }
    expect(sent).toBeInstanceOf(Uint8Array);
    const bytes = sent as Uint8Array;
    expect(bytes.buffer.byteLength).toBe(bytes.byteLength);
    expect(JSON.parse(new TextDecoder().decode(bytes))).toEqual({ episode_id: { rollout_id: 'r-p0-s0', attempt: 1 }, task: { prompt: 'x' } });
  });
});
