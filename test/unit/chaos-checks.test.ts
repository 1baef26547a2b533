// The fault-schedule command's pure parts: schedules drawn from a seed, and the checks run after
// each schedule (each must catch the violation it names).
import { describe, expect, it } from 'vitest';
import { type CompletedAttempt, checkCompletions, checkModelCalls, checkParticipants, checkRetention } from '../../scripts/chaos/checks.js';
import { describeFault, drawSchedule, FAULT_KINDS, type FaultKind, gymCrashes } from '../../scripts/chaos/schedule.js';

const SERVERS = ['policy_model', 'simple_agent', 'counter', 'counter_env'];

describe('drawSchedule', () => {
  it('draws the same schedule from the same seed, and different ones from others', () => {
    expect(drawSchedule(42, { servers: SERVERS })).toEqual(drawSchedule(42, { servers: SERVERS }));
    const seeds = Array.from({ length: 50 }, (_, i) => JSON.stringify(drawSchedule(i, { servers: SERVERS }).faults));
    expect(new Set(seeds).size).toBeGreaterThan(45);
  });

  it('with workers, half the server kills hit one worker; without, the schedules are the single-process ones', () => {
    let workerKills = 0;
    let serverKills = 0;
    for (let seed = 0; seed < 300; seed++) {
      const one = drawSchedule(seed, { servers: SERVERS });
      expect(drawSchedule(seed, { servers: SERVERS, workers: 1 })).toEqual(one);
      for (const f of one.faults) expect(f.worker).toBeUndefined();
      for (const f of drawSchedule(seed, { servers: SERVERS, workers: 2 }).faults) {
        if (f.kind !== 'server_kill') continue;
        serverKills += 1;
        if (f.worker === undefined) continue;
        workerKills += 1;
        expect([0, 1]).toContain(f.worker);
        expect(describeFault(f)).toMatch(/^server_kill:\w+\/w[01]@/);
      }
    }
    expect(workerKills).toBeGreaterThan(serverKills * 0.3);
    expect(workerKills).toBeLessThan(serverKills * 0.7);
  });

  it('keeps to its bounds: 5–6 steps, 1–4 faults, servers from the list, step triggers rising and before the last step', () => {
    let crashedTwice = 0;
    let aimed = 0;
    let faults = 0;
    const kinds = new Set<FaultKind>();
    for (let seed = 0; seed < 500; seed++) {
      const s = drawSchedule(seed, { servers: SERVERS });
      expect(s.steps).toBeGreaterThanOrEqual(5);
      expect(s.steps).toBeLessThanOrEqual(6);
      expect(s.faults.length).toBeGreaterThanOrEqual(1);
      expect(s.faults.length).toBeLessThanOrEqual(4);
      const steps = s.faults.flatMap((f) => (f.trigger.on === 'step' ? [f.trigger.step] : []));
      expect([...steps].sort((a, b) => a - b)).toEqual(steps);
      for (const step of steps) expect(step).toBeLessThan(s.steps);
      for (const f of s.faults) {
        if (f.kind === 'server_kill' || f.kind === 'server_stop') expect(SERVERS).toContain(f.server);
        else expect(f.server).toBeUndefined();
        expect(describeFault(f)).toMatch(new RegExp(`^${f.kind}`));
        kinds.add(f.kind);
      }
      if (gymCrashes(s) >= 2) crashedTwice++;
      aimed += s.faults.filter((f) => f.trigger.on === 'checkpoint').length;
      faults += s.faults.length;
    }
    // The mix the command promises: every kind of fault, double Gym crashes common, about a third aimed at checkpoints.
    expect([...kinds].sort()).toEqual([...FAULT_KINDS].sort());
    expect(crashedTwice / 500).toBeGreaterThan(0.2);
    expect(aimed / faults).toBeGreaterThan(0.25);
    expect(aimed / faults).toBeLessThan(0.45);
  });
});

describe('checks', () => {
  const done = (...keys: string[]): CompletedAttempt[] => keys.map((key) => ({ key, reward: 0.5 }));

  it('completions: exactly one per rollout, none missing, rewards in [0, 1]', () => {
    const started = new Set(['r.g0', 'r.g1', 'r.g2']);
    expect(
      checkCompletions(
        3,
        started,
        new Map([
          ['r.g0', done('r.g0')],
          ['r.g1', done('r.g1-a1')],
          ['r.g2', done('r.g2')],
        ]),
      ),
    ).toEqual([]);
    expect(
      checkCompletions(
        3,
        started,
        new Map([
          ['r.g0', done('r.g0')],
          ['r.g1', done('r.g1', 'r.g1-a1')],
        ]),
      ).join('\n'),
    ).toMatch(/1 rollouts never completed \(r\.g2\)[\s\S]*2 rollouts completed, expected 3[\s\S]*r\.g1 completed 2 times/);
    // A cohort rerun whole after a lost reply: its sealed siblings complete again, but only as a
    // whole group; one sibling completed twice while the others did not rerun is still a violation.
    const group = new Set(['r.p0.g0', 'r.p0.g1', 'r.p1.g0']);
    const rerun = new Map([
      ['r.p0.g0', done('r.p0.g0-a1')],
      ['r.p0.g1', done('r.p0.g1', 'r.p0.g1-a1')],
      ['r.p1.g0', done('r.p1.g0')],
    ]);
    expect(checkCompletions(3, group, rerun)).toEqual([]);
    rerun.set('r.p0.g0', done('r.p0.g0'));
    expect(checkCompletions(3, group, rerun)).toEqual(['r.p0.g1 completed 2 times (r.p0.g1, r.p0.g1-a1)']);
    const bad = new Map<string, CompletedAttempt[]>([
      ['r.g0', [{ key: 'r.g0', reward: 1.5 }]],
      ['r.g1', [{ key: 'r.g1', reward: null }]],
      ['r.g2', done('r.g2')],
    ]);
    expect(checkCompletions(3, started, bad)).toEqual(['r.g0: reward 1.5 outside [0, 1]', 'r.g1: reward null outside [0, 1]']);
  });

  it('model calls: a call of attempt N after the first call of N+1 is a violation; before it is not', () => {
    const call = (index: number, attempt: number, rollout_id = 'r.g0') => ({ index, rollout_id, attempt });
    expect(checkModelCalls([call(0, 0), call(1, 0), call(2, 1), call(3, 1), call(4, 0, 'r.g1'), call(5, 2)])).toEqual([]);
    expect(checkModelCalls([call(0, 0), call(1, 1), call(2, 0), call(3, 1, 'r.g1')])).toEqual(['r.g0: a call of attempt 0 (#2) after attempt 1 began (#1)']);
  });

  it('participants: idle with no work, retire mark or restored episode left; cut tallies do not count', () => {
    const idle = { name: 'm', phase: 'idle', retired_rollouts: 0, counts: { inflight: 0, held: 0, cut: 7 } };
    expect(checkParticipants([idle])).toEqual([]);
    expect(
      checkParticipants([
        { ...idle, phase: 'prepared' },
        { ...idle, name: 'a', retired_rollouts: 2, counts: { sessions: 1, at_boundary: 1 } },
        { ...idle, name: 'e', restored_pending: ['r.g0-a1'] },
      ]),
    ).toEqual(['m: phase prepared', 'a: 2 retire marks left', 'a: left over sessions 1, at_boundary 1', 'e: restored episodes never resumed (r.g0-a1)']);
  });

  it('retention: at most k snapshots in the whole directory; no bootstrap snapshot once a step anchor is durable', () => {
    const a = (anchor: string, snapshots: string[], durable = true) => ({ anchor, durable, snapshots });
    expect(checkRetention([a('bootstrap', [], false), a('step_1', ['snapshot_000001']), a('step_2', ['snapshot_000001'])], 2)).toEqual([]);
    expect(checkRetention([a('step_1', ['snapshot_000001']), a('step_2', ['snapshot_000001', 'snapshot_000002'])], 2)).toEqual([
      '3 snapshots kept (keep_latest_k 2): step_1/snapshot_000001, step_2/snapshot_000001, step_2/snapshot_000002',
    ]);
    expect(checkRetention([a('bootstrap', ['snapshot_000001'], false), a('step_1', ['snapshot_000001'])], 2)).toEqual([
      'bootstrap snapshots left after a durable step anchor: snapshot_000001',
    ]);
    expect(checkRetention([a('bootstrap', ['snapshot_000001'], false), a('step_1', ['snapshot_000001'], false)], 2)).toEqual([]);
  });
});
