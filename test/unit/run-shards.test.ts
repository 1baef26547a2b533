// How the run spreads its attempts over rollout shards (workflows/run/shards.ts): enough shards that
// each has about `rollouts_per_shard` attempts in flight, groups spread evenly, and
// the shards' report batches together stay within a few signals a second into the run.
import { describe, expect, it } from 'vitest';
import { SHARD_MAX_HISTORY_EVENTS, flushIntervalMs, runHeartbeatTimeoutS, shardCount, shardMaxHistoryEvents, shardOf } from '../../workflows/run/shards.js';
import { runConfig } from '../workflows/harness.js';

describe('rollout shards', () => {
  it('one shard per rollouts_per_shard attempts of the in-flight window, at least one', () => {
    expect(shardCount(runConfig('s', { async_rl: { max_in_flight_groups: 2 }, grpo: { num_generations_per_prompt: 2 } }))).toBe(1);
    const big = runConfig('s', { async_rl: { max_in_flight_groups: 4_000 }, grpo: { num_generations_per_prompt: 4 } });
    expect(shardCount(big)).toBe(16);
    expect(shardCount({ ...big, controller: { ...big.controller, rollouts_per_shard: 500 } })).toBe(32);
  });

  it('every attempt of a group goes to one shard; 4,000 groups over 32 shards stay within 1.5× the mean', () => {
    expect(shardOf('run.s1-p7', 32)).toBe(shardOf('run.s1-p7', 32));
    const counts = new Array<number>(32).fill(0);
    for (let i = 0; i < 4_000; i++) counts[shardOf(`run.s1-p${i}`, 32)]! += 1;
    expect(Math.max(...counts)).toBeLessThanOrEqual(1.5 * (4_000 / 32));
    expect(Math.min(...counts)).toBeGreaterThan(0);
    // With 4 generations a group, the fullest shard owns far fewer than Temporal's 2,000 pending children.
    expect(Math.max(...counts) * 4).toBeLessThan(1_000);
  });

  it('a shard continues as new within its own bound of events, or sooner at controller.max_history_events', () => {
    expect(shardMaxHistoryEvents(runConfig('s'))).toBe(SHARD_MAX_HISTORY_EVENTS);
    expect(shardMaxHistoryEvents(runConfig('s', { controller: { max_history_events: 40_000 } }))).toBe(SHARD_MAX_HISTORY_EVENTS);
    expect(shardMaxHistoryEvents(runConfig('s', { controller: { max_history_events: 500 } }))).toBe(500);
  });

  it('report batches from all shards together: at most 16 signals a second into the run, in any 10 s', () => {
    // A shard fits ⌊10 s ÷ interval⌋ + 1 reports into 10 s (one at each end).
    const in10s = (shards: number) => (shards * (Math.floor(10_000 / flushIntervalMs(shards)) + 1)) / 10;
    for (let shards = 1; shards <= 160; shards++) expect(in10s(shards)).toBeLessThanOrEqual(16);
    for (let shards = 1; shards <= 400; shards++) expect(shards * (1_000 / flushIntervalMs(shards))).toBeLessThanOrEqual(16);
    expect(flushIntervalMs(1)).toBe(1_000);
    expect(flushIntervalMs(32)).toBe(2_001);
  });

  it("the /run heartbeat timeout: the configured one, or longer when the window's beats would pass run_heartbeats_per_s", () => {
    const window = (groups: number, controller: Record<string, number> = {}) =>
      runConfig('s', { async_rl: { max_in_flight_groups: groups }, grpo: { num_generations_per_prompt: 4 }, controller });
    expect(runHeartbeatTimeoutS(window(2))).toBe(120);
    expect(runHeartbeatTimeoutS(window(500))).toBe(120); // 2,000 in flight: 2,000 / (0.5 × 50) = 80 s
    expect(runHeartbeatTimeoutS(window(2_000))).toBe(320);
    expect(runHeartbeatTimeoutS(window(4_000))).toBe(640);
    expect(runHeartbeatTimeoutS(window(4_000, { run_heartbeats_per_s: 200 }))).toBe(160);
    expect(runHeartbeatTimeoutS(window(2, { run_heartbeat_timeout_s: 15 }))).toBe(15);
    // Each /run beaten once per half of the timeout: the run's beats stay within the budget.
    for (const groups of [2, 500, 2_000, 4_000]) expect((groups * 4) / (0.5 * runHeartbeatTimeoutS(window(groups)))).toBeLessThanOrEqual(50);
  });
});
