// The control-plane contract as data, shared by the in-process contract tests of the memory
// participant (control-plane.test.ts) and the same checks against real multi-worker servers of
// every kind (workers.test.ts): one table, so both are held to the same contract.
import { rm, writeFile } from 'node:fs/promises';
import { expect } from 'vitest';

/** Authorization headers every route refuses with 401 `unauthorized` (besides a wrong token). */
export const BAD_AUTHORIZATION = (token: string): Array<Record<string, string>> => [
  {},
  { authorization: 'Bearer nope' },
  { authorization: `bearer ${token}` },
  { authorization: `Bearer  ${token}` },
  { authorization: token },
];

export const CONTROL_OPS = ['status', 'prepare', 'renew', 'commit', 'restore', 'resume', 'retire', 'forget'] as const;

/** Malformed bodies every route with a body refuses with 422 and a detail array. */
export function malformedBodies(deadlineTs: number): Record<string, unknown[]> {
  const id = 'ckpt-1';
  const dl = deadlineTs;
  const invalidCommon: unknown[] = [
    '',
    '{not json',
    '[]',
    'null',
    '42',
    {},
    { checkpoint_id: id },
    { deadline_ts: dl },
    { checkpoint_id: '', deadline_ts: dl },
    { checkpoint_id: '../x', deadline_ts: dl },
    { checkpoint_id: '.x', deadline_ts: dl },
    { checkpoint_id: 'x'.repeat(129), deadline_ts: dl },
    { checkpoint_id: 7, deadline_ts: dl },
    { checkpoint_id: id, deadline_ts: 'soon' },
    { checkpoint_id: id, deadline_ts: null },
    { checkpoint_id: id, deadline_ts: true },
    { checkpoint_id: id, deadline_ts: dl, unknown_field: 1 },
  ];
  const perRoute: Record<string, unknown[]> = {
    prepare: [
      { checkpoint_id: id, deadline_ts: dl, restarts: 'r1' },
      { checkpoint_id: id, deadline_ts: dl, restarts: ['x-a1-a2'] },
      { checkpoint_id: id, deadline_ts: dl, restarts: [1] },
    ],
    renew: [{ checkpoint_id: id, deadline_ts: dl, restarts: [] }],
    resume: [{ checkpoint_id: id, deadline_ts: dl, episode_ids: [] }],
    commit: [
      { checkpoint_id: id, deadline_ts: dl },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '' },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: 3 },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: 'r1' },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: [{ rollout_id: 'r1', attempt: -1 }] },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: [{ rollout_id: 'r1', attempt: 1.5 }] },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: [{ rollout_id: 'x-a1', attempt: 0 }] },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: [{ rollout_id: 'r1', attempt: 0, extra: 1 }] },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: ['r1'] },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', stop: 'yes' },
    ],
    restore: [
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x' },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: null },
      { checkpoint_id: id, deadline_ts: dl, episode_ids: [] },
      { checkpoint_id: id, deadline_ts: dl, checkpoint_dir: '/tmp/x', episode_ids: [{ attempt: 0 }] },
    ],
    retire: [
      { checkpoint_id: id, deadline_ts: dl },
      { checkpoint_id: id, deadline_ts: dl, episode_ids: [] },
      { checkpoint_id: id, deadline_ts: dl, episode_ids: [{ rollout_id: '-a1', attempt: 0 }] },
      { checkpoint_id: id, deadline_ts: dl, episode_ids: [{ rollout_id: 'r', attempt: Number.MAX_SAFE_INTEGER + 2 }] },
    ],
    forget: [
      { checkpoint_id: id, deadline_ts: dl },
      { checkpoint_id: id, deadline_ts: dl, rollout_ids: [] },
      { checkpoint_id: id, deadline_ts: dl, rollout_ids: [1] },
      { checkpoint_id: id, deadline_ts: dl, rollout_ids: 'r1' },
    ],
  };
  return Object.fromEntries(Object.entries(perRoute).map(([op, bodies]) => [op, [...invalidCommon, ...bodies]]));
}

export const PHASES = ['idle', 'preparing', 'prepared', 'committed', 'restored'] as const;
export type Phase = (typeof PHASES)[number];

/**
 * §8.2: the answer of each operation in each phase under the phase's own checkpoint ID: an error
 * code, a reply phase, `idempotent`/`reopen` (a resume's), or `ok`.
 */
export const PHASE_TABLE: Record<string, Record<Phase, string>> = {
  prepare: { idle: 'prepared', preparing: 'preparing', prepared: 'prepared', committed: 'prepared', restored: 'invalid_phase' },
  renew: { idle: 'invalid_phase', preparing: 'ok', prepared: 'ok', committed: 'ok', restored: 'ok' },
  commit: { idle: 'invalid_phase', preparing: 'invalid_phase', prepared: 'committed', committed: 'committed', restored: 'invalid_phase' },
  restore: { idle: 'restored', preparing: 'invalid_phase', prepared: 'invalid_phase', committed: 'invalid_phase', restored: 'restored' },
  resume: { idle: 'idempotent', preparing: 'reopen', prepared: 'reopen', committed: 'reopen', restored: 'reopen' },
  retire: { idle: 'ok', preparing: 'invalid_phase', prepared: 'invalid_phase', committed: 'invalid_phase', restored: 'ok' },
  forget: { idle: 'ok', preparing: 'invalid_phase', prepared: 'invalid_phase', committed: 'invalid_phase', restored: 'ok' },
};

export interface PhaseTableCall {
  id: string;
  deadlineTs: number;
  /** Where a commit writes and a restore reads. */
  commitDir: string;
  restoreDir: string;
  episodeIds: ReadonlyArray<{ rollout_id: string; attempt: number }>;
}

/** The body of `op` in a phase-table cell. */
export function phaseTableBody(op: string, c: PhaseTableCall): unknown {
  const base = { checkpoint_id: c.id, deadline_ts: c.deadlineTs };
  const bodies: Record<string, unknown> = {
    prepare: base,
    renew: base,
    commit: { ...base, checkpoint_dir: c.commitDir, episode_ids: c.episodeIds },
    restore: { ...base, checkpoint_dir: c.restoreDir, episode_ids: c.episodeIds },
    resume: base,
    retire: { ...base, episode_ids: [{ rollout_id: 'zz', attempt: 0 }] },
    forget: { ...base, rollout_ids: ['zz'] },
  };
  return bodies[op];
}

/** Checks one reply against its phase-table cell. */
export function expectPhaseAnswer(r: { status: number; body: any }, want: string): void {
  if (want === 'invalid_phase') {
    expect(r.status, JSON.stringify(r.body)).toBe(409);
    expect(r.body.error.code).toBe(want);
    return;
  }
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  if (want === 'idempotent') expect(r.body).toEqual({ phase: 'idle', idempotent: true });
  else if (want === 'reopen') expect(r.body).toEqual({ phase: 'idle', idempotent: false });
  else if (want === 'ok') expect(r.body).toBeTypeOf('object');
  else expect(r.body.phase).toBe(want);
}

/**
 * Ways a participant's manifest can be corrupt (§9.6 steps 1–2), each a restore must refuse with
 * 422 `invalid_checkpoint_state`: `good` is the manifest's text, written back between cases.
 */
export function manifestCorruptions(manifestPath: string, good: string): Array<[string, () => Promise<void>]> {
  return [
    ['manifest not JSON', () => writeFile(manifestPath, '{oops')],
    ['manifest not an object', () => writeFile(manifestPath, '[1]')],
    ['manifest field missing', () => writeFile(manifestPath, JSON.stringify({ ...JSON.parse(good), records_sha256: undefined }))],
    ['records outside the directory', () => writeFile(manifestPath, JSON.stringify({ ...JSON.parse(good), records_file: '../records.jsonl' }))],
    ['records missing', () => writeFile(manifestPath, JSON.stringify({ ...JSON.parse(good), records_file: `records-${'0'.repeat(64)}.jsonl` }))],
    ['manifest missing', () => rm(manifestPath)],
  ];
}
