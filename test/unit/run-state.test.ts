// The training run's state under its shards' reports (workflows/run/state.ts, pure): sealed groups
// join the groups waiting for a step once, counts add up, unfinished groups are what each shard
// last reported plus what the run assigned since, and a crash reported before the last recovery
// starts no second one.
import { describe, expect, it } from 'vitest';
import type { ShardReport } from '../../workflows/messages.js';
import {
  MAX_KEPT_OUTCOMES,
  MAX_RECOVERY_SAMPLE,
  applyShardReports,
  initialState,
  keepRecovery,
  totalInFlight,
  totalUnfinished,
  type RecoveryRecord,
} from '../../workflows/run/state.js';

function report(over: Partial<ShardReport>): ShardReport {
  return { shard: 0, sealed: [], completed: 0, failed: 0, assigned: 0, inFlight: 0, unfinished: 0, epoch: 0, ...over };
}

describe('the run state under its shards\u2019 reports', () => {
  it('a sealed group waits for a step once, with its shard; completed and failed rollouts add up', () => {
    const st = initialState();
    st.shards = 2;
    st.reports = [report({ shard: 1, sealed: [3], completed: 4, failed: 1 }), report({ shard: 1, sealed: [3], completed: 0 })];
    applyShardReports(st);
    expect(st.ready).toEqual([[3, 1]]);
    expect(st).toMatchObject({ completedRollouts: 4, failedRollouts: 1, reports: [] });
  });

  it('unfinished groups: as each shard last reported, plus the ones assigned after; in flight as reported', () => {
    const st = initialState();
    st.shards = 2;
    st.assigned = [5, 3];
    expect(totalUnfinished(st)).toBe(8);
    st.reports = [report({ shard: 0, assigned: 4, unfinished: 2, inFlight: 7 }), report({ shard: 1, assigned: 3, unfinished: 3, inFlight: 11 })];
    applyShardReports(st);
    // Shard 0 had seen 4 of its 5 groups (2 of them unfinished then); shard 1 all 3.
    expect(totalUnfinished(st)).toBe(2 + 1 + 3);
    expect(totalInFlight(st)).toBe(18);
  });

  it('a crash a shard noticed before the last recovery settled it starts no second recovery; one after it does', () => {
    const st = initialState();
    st.recoveryEpoch = 1;
    st.reports = [report({ gymCrashed: 'r.p0.g0: gym_restarted', epoch: 0 })];
    applyShardReports(st);
    expect(st.recoveryNeeded).toBe(false);
    st.reports = [report({ gymCrashed: 'r.p1.g0: gym_restarted', epoch: 1 })];
    applyShardReports(st);
    expect(st.recoveryNeeded).toBe(true);
  });

  it('the state is small and plain JSON (continue-as-new carries it)', () => {
    const st = initialState();
    st.shards = 32;
    st.assigned = Array(32).fill(125);
    for (let i = 0; i < 4_000; i++) st.ready.push([i, i % 32]);
    const text = JSON.stringify(st);
    expect(JSON.parse(text)).toEqual(st);
    // 4,000 sealed groups waiting (16,000 rollouts): far under the 256 KB a workflow should carry.
    expect(text.length).toBeLessThan(64_000);
  });

  it('recoveries keep a bounded sample of continued keys, from every shard in turn, and the newest records only', () => {
    const st = initialState();
    const rec: RecoveryRecord = {
      at: '2026-12-04T00:00:00Z',
      restoreId: 'restore-1',
      snapshotDir: '/c/s',
      continued: 3_200,
      restarted: 0,
      continuedSample: [],
    };
    // 32 shards answered 100 continued keys each.
    const perShard = Array.from({ length: 32 }, (_, k) => Array.from({ length: 100 }, (_, i) => `scale-16000.p${k * 1000 + i}.g0.a1`));
    keepRecovery(st, rec, perShard);
    const kept = st.recoveries[0]!.continuedSample;
    expect(kept).toHaveLength(MAX_RECOVERY_SAMPLE);
    expect(kept.slice(0, 3)).toEqual(['scale-16000.p0.g0.a1', 'scale-16000.p1000.g0.a1', 'scale-16000.p2000.g0.a1']);
    const shardOf = new Map(perShard.flatMap((keys, k) => keys.map((key) => [key, k] as const)));
    expect(new Set(kept.map((key) => shardOf.get(key))).size).toBe(32);
    // Fewer than the bound: all of them.
    keepRecovery(st, rec, [['a'], [], ['b', 'c']]);
    expect(st.recoveries[1]!.continuedSample).toEqual(['a', 'b', 'c']);
    for (let i = 0; i < 2 * MAX_KEPT_OUTCOMES; i++) keepRecovery(st, rec, perShard);
    expect(st.recoveries).toHaveLength(MAX_KEPT_OUTCOMES);
    // The most a run carries of its recoveries stays well under the 256 KB continue-as-new bound.
    expect(JSON.stringify(st).length).toBeLessThan(256_000);
  });
});
