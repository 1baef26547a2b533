// Load-time invariants of the recovery ledger (workflows/ledger-invariants.ts, controller.md §5.2):
// ledgers built with the real transitions pass; each violation is reported, all at once.
import { describe, expect, it } from 'vitest';
import * as L from '../../workflows/ledger.js';
import { dispatchAll, ep, reserve as reserveGroup } from '../helpers/ledger.js';
import { checkLedger, ledgerViolations, LedgerInvariantError } from '../../workflows/ledger-invariants.js';

/** A counter_env group of `size` siblings (the shared fixture, positional). */
const reserve = (l: L.Ledger, id: string, size = 2, granularity: L.RecoveryGranularity = 'sibling'): L.PromptGroup =>
  reserveGroup(l, id, { size, granularity });

/**
 * A ledger exercising every transition: a ready group (p0), a generating group with one sealed
 * sibling and a live-failure retry (p1), a prompt-group cohort retried whole (p2), and a sibling
 * continued from a restored turn plus one restarted from input (p3).
 */
function validLedger(): L.Ledger {
  const l = L.emptyLedger('run');
  reserve(l, 'run.p0');
  reserve(l, 'run.p1', 3);
  reserve(l, 'run.p2', 2, 'prompt_group');
  reserve(l, 'run.p3', 2);
  l.cursor = 4;
  dispatchAll(l);
  L.sealAttempt(l, ep('run.p0.g0'), 1, true);
  L.sealAttempt(l, ep('run.p0.g1'), 0, false);
  L.sealAttempt(l, ep('run.p1.g0'), 0.5, true);
  L.failAttempt(l, ep('run.p1.g1'), 'boom');
  L.sealAttempt(l, ep('run.p2.g0'), 1, true);
  L.failAttempt(l, ep('run.p2.g1'), 'boom');
  const p3 = l.groups['run.p3']!;
  L.continueFromRestore(p3.siblings[0]!, 'counter_env');
  L.restartFromInput(p3.siblings[1]!, 'not_restored', 2);
  dispatchAll(l);
  return l;
}

/** The violation messages of a ledger (joined with where they are). */
function violations(l: L.Ledger): string[] {
  return ledgerViolations(l).map((v) => `${v.at}: ${v.message}`);
}

function group(l: L.Ledger, id: string): L.PromptGroup {
  return l.groups[id]!;
}

function attempt(l: L.Ledger, id: string, g: number, i: number): L.Attempt {
  return l.groups[id]!.siblings[g]!.attempts[i]!;
}

describe('ledger invariants: valid ledgers pass', () => {
  it('an empty ledger', () => {
    expect(() => checkLedger(L.emptyLedger('run'))).not.toThrow();
  });

  it('a ledger built with every transition', () => {
    const l = validLedger();
    expect(group(l, 'run.p0').status).toBe('ready_to_finalize');
    expect(group(l, 'run.p2').siblings.every((s) => s.attempts.length === 2)).toBe(true);
    expect(attempt(l, 'run.p3', 0, 1).continued).toBe(true);
    expect(violations(l)).toEqual([]);
    expect(() => checkLedger(l)).not.toThrow();
  });

  it('after consuming a group and surviving a JSON round trip (the snapshot form)', () => {
    const l = validLedger();
    L.consumeGroup(l, 'run.p0');
    expect(() => checkLedger(JSON.parse(JSON.stringify(l)) as L.Ledger)).not.toThrow();
  });
});

describe('ledger invariants: each violation is reported', () => {
  const cases: Array<[string, (l: L.Ledger) => void, RegExp]> = [
    ['unsupported schema_version', (l) => (l.schema_version = 99), /ledger: schema_version 99 is not supported/],
    [
      'siblings count ≠ expected_generations',
      (l) => (group(l, 'run.p1').expected_generations = 4),
      /group run\.p1: has 3 siblings but expected_generations is 4/,
    ],
    ['a sibling missing (count and contiguity)', (l) => group(l, 'run.p3').siblings.pop(), /group run\.p3: has 1 siblings but expected_generations is 2/],
    [
      'generation indices not contiguous from 0',
      (l) => {
        const s = group(l, 'run.p1').siblings;
        [s[1], s[2]] = [s[2]!, s[1]!];
      },
      /group run\.p1: generation indices are not contiguous from 0: position 1 holds 2/,
    ],
    [
      'rollout_id not <group_id>.g<index>',
      (l) => (group(l, 'run.p1').siblings[0]!.rollout_id = 'run.p1.g7'),
      /sibling run\.p1\.g7: rollout_id should be run\.p1\.g0/,
    ],
    [
      'duplicate attempt numbers',
      (l) => (attempt(l, 'run.p1', 1, 1).gym_attempt = 0),
      /attempt run\.p1\.g1#1: gym_attempt 0 does not increase over the previous attempt's 0/,
    ],
    [
      'decreasing attempt numbers',
      (l) => {
        attempt(l, 'run.p2', 0, 0).gym_attempt = 5;
      },
      /attempt run\.p2\.g0#1: gym_attempt 1 does not increase over the previous attempt's 5/,
    ],
    ['a negative attempt number', (l) => (attempt(l, 'run.p0', 0, 0).gym_attempt = -1), /attempt run\.p0\.g0#0: gym_attempt -1 is not a non-negative integer/],
    ['an unsealed attempt with a reward', (l) => (attempt(l, 'run.p1', 1, 0).reward = 1), /attempt run\.p1\.g1#0: is failed but carries a reward/],
    [
      'an unsealed attempt with mask_sample',
      (l) => (attempt(l, 'run.p3', 0, 1).mask_sample = true),
      /attempt run\.p3\.g0#1: is dispatched but carries mask_sample/,
    ],
    ['a sealed attempt without a reward', (l) => (attempt(l, 'run.p0', 0, 0).reward = null), /attempt run\.p0\.g0#0: is sealed without a finite reward/],
    ['a sealed attempt with a NaN reward', (l) => (attempt(l, 'run.p0', 0, 0).reward = Number.NaN), /is sealed without a finite reward/],
    [
      'a sealed attempt without a boolean mask',
      (l) => (attempt(l, 'run.p0', 1, 0).mask_sample = null),
      /attempt run\.p0\.g1#0: is sealed without a boolean mask_sample/,
    ],
    [
      'a generating group with every sibling sealed',
      (l) => (group(l, 'run.p0').status = 'generating'),
      /group run\.p0: is generating but every sibling is sealed/,
    ],
    [
      'ready_to_finalize with an unsealed sibling',
      (l) => (group(l, 'run.p1').status = 'ready_to_finalize'),
      /group run\.p1: is ready_to_finalize but 2 sibling\(s\) are not sealed/,
    ],
    ['consumed with an unsealed sibling', (l) => (group(l, 'run.p3').status = 'consumed'), /group run\.p3: is consumed but 2 sibling\(s\) are not sealed/],
    [
      'a continued attempt without a previous attempt',
      (l) => (attempt(l, 'run.p1', 0, 0).continued = true),
      /attempt run\.p1\.g0#0: is continued but has no previous attempt/,
    ],
    [
      'a continued attempt without a gym_instance_id',
      (l) => (attempt(l, 'run.p3', 0, 1).gym_instance_id = null),
      /attempt run\.p3\.g0#1: is continued but names no gym_instance_id/,
    ],
    [
      'a superseded attempt still dispatched',
      (l) => (attempt(l, 'run.p1', 1, 0).status = 'dispatched'),
      /attempt run\.p1\.g1#0: is dispatched but superseded by a later attempt/,
    ],
    ['a sibling with no attempt', (l) => (group(l, 'run.p3').siblings[1]!.attempts = []), /sibling run\.p3\.g1: has no attempt/],
    ['order lists a group twice', (l) => l.order.push('run.p1'), /ledger: order lists group run\.p1 more than once/],
    ['order lists a missing group', (l) => l.order.push('run.p9'), /ledger: order lists group run\.p9, which is not in groups/],
    ['order misses a group', (l) => (l.order = l.order.filter((id) => id !== 'run.p2')), /ledger: group run\.p2 is missing from order/],
    ['a group stored under another key', (l) => (group(l, 'run.p2').group_id = 'run.p5'), /group run\.p2: group_id run\.p5 differs from its key/],
    ['an unknown attempt status', (l) => (attempt(l, 'run.p1', 0, 0).status = 'lost' as L.AttemptStatus), /unknown status lost/],
    ['an unknown restore level', (l) => (group(l, 'run.p1').restore_level = 'prefix' as L.TargetLevel), /group run\.p1: unknown restore_level prefix/],
    [
      'an unknown granularity',
      (l) => (group(l, 'run.p1').recovery_granularity = 'turn' as L.RecoveryGranularity),
      /group run\.p1: unknown recovery_granularity turn/,
    ],
    ['a negative cursor', (l) => (l.cursor = -1), /ledger: cursor -1/],
  ];

  it.each(cases)('%s', (_name, corrupt, expected) => {
    const l = validLedger();
    corrupt(l);
    const found = violations(l);
    expect(
      found.some((m) => expected.test(m)),
      `got:\n${found.join('\n')}`,
    ).toBe(true);
    expect(() => checkLedger(l)).toThrow(LedgerInvariantError);
  });

  it('lists every violation in one error', () => {
    const l = validLedger();
    l.schema_version = 0;
    group(l, 'run.p1').status = 'ready_to_finalize';
    attempt(l, 'run.p0', 0, 0).reward = null;
    let err: unknown;
    try {
      checkLedger(l);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(LedgerInvariantError);
    const e = err as LedgerInvariantError;
    expect(e.violations).toHaveLength(3);
    expect(e.message).toMatch(/violates 3 load-time invariant\(s\)/);
    expect(e.message).toMatch(/schema_version 0/);
    expect(e.message).toMatch(/run\.p1: is ready_to_finalize/);
    expect(e.message).toMatch(/run\.p0\.g0#0: is sealed without a finite reward/);
  });
});
