// genrm_compare: the deterministic judge, cohort collection and publication, replays, conflicts,
// the collection timeout, and its replayable verify during an open checkpoint.
import type { FastifyInstance } from 'fastify';
import { afterAll, describe, expect, it } from 'vitest';
import * as genrmMod from '../../servers/resources/genrm-compare.js';
import { cohortCoordinates } from '../../servers/resources/genrm-compare.js';
import { CohortRegistry } from '../../servers/resources/genrm-cohorts.js';
import { answerQuality, answerText, cohortRewards, comparisonPairs, GENRM_ANSWERS, judgePair, tiebreak } from '../../servers/resources/genrm-judge.js';
import { buildServer, Client, control, settlesWithin, soon } from './resources-helpers.js';

const apps: FastifyInstance[] = [];
afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

async function genrm(options: Record<string, unknown>): Promise<FastifyInstance> {
  const app = await buildServer(genrmMod, 'genrm', 'genrm_compare', options);
  apps.push(app);
  return app;
}

const response = (text: string) => ({
  id: 'resp',
  object: 'response',
  output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text }] }],
});

const verifyBody = (slot: number, text: string, extra: Record<string, unknown> = {}) => ({
  responses_create_params: { input: [{ role: 'user', content: '[task genrm prompt=p17]' }] },
  response: response(text),
  _ng_group_id: 'g1',
  _ng_group_attempt: 0,
  _ng_rollout_index: slot,
  prompt_id: 'p17',
  ...extra,
});

describe('deterministic judge', () => {
  it('scores the canonical answers 5, 3, 2, 1', () => {
    expect(Object.values(GENRM_ANSWERS).map(answerQuality)).toEqual([5, 3, 2, 1]);
  });

  it('ranks by quality gap, and on equal quality prefers the shorter answer through the tiebreak', () => {
    expect(judgePair(GENRM_ANSWERS.answer_a, GENRM_ANSWERS.answer_d)).toEqual({ score_1: 5, score_2: 1, ranking: 1 });
    expect(judgePair(GENRM_ANSWERS.answer_c, GENRM_ANSWERS.answer_b)).toEqual({ score_1: 2, score_2: 3, ranking: 5 });
    const tie = judgePair('Yes.', 'Yes, sure.');
    expect(tie).toEqual({ score_1: 1, score_2: 1, ranking: 3 });
    expect(tiebreak(tie)).toEqual([1.5, 0.5]);
    expect(tiebreak(judgePair('same', 'same'))).toEqual([1, 1]);
    expect(tiebreak({ score_1: 4, score_2: 2, ranking: 6 })).toEqual([4, 2]);
  });

  it('builds circular and all-pairs comparisons', () => {
    expect(comparisonPairs(3, 'circular')).toEqual([
      [0, 1],
      [1, 2],
      [2, 0],
    ]);
    expect(comparisonPairs(3, 'all_pairs')).toEqual([
      [0, 1],
      [0, 2],
      [1, 2],
    ]);
    expect(comparisonPairs(1, 'circular')).toEqual([]);
  });

  it('rewards are mean adjusted scores scaled to [0, 1]; a lone member gets the default score', () => {
    const r = cohortRewards([GENRM_ANSWERS.answer_a, GENRM_ANSWERS.answer_b, GENRM_ANSWERS.answer_d], 'circular');
    expect(r).toEqual([1, 0.5, 0]);
    expect(cohortRewards(['anything'], 'circular')).toEqual([0.5]);
    for (const x of cohortRewards(['a', 'bb', 'ccc', 'a'], 'all_pairs')) expect(x).toBeGreaterThanOrEqual(0);
  });

  it('reads the answer from the response output messages', () => {
    expect(answerText(response('hi'))).toBe('hi');
    expect(answerText({ output: [{ type: 'function_call', name: 'x' }] })).toBe('');
    expect(answerText(undefined)).toBe('');
  });
});

describe('cohort coordinates', () => {
  it('reads top-level and task_data fields, with defaults and the legacy fallback', () => {
    expect(cohortCoordinates({ _ng_group_id: 'g', _ng_rollout_index: 2 })).toEqual({
      ok: true,
      member: { groupId: 'g', attempt: 0, slot: 2, promptId: undefined },
    });
    expect(cohortCoordinates({ task_data: { _ng_group_id: 'g', _ng_group_attempt: 1, _ng_rollout_index: 0, prompt_id: 'p' } })).toEqual({
      ok: true,
      member: { groupId: 'g', attempt: 1, slot: 0, promptId: 'p' },
    });
    expect(cohortCoordinates({ _ng_task_index: 7, _ng_rollout_index: 0 })).toMatchObject({ ok: true, member: { groupId: 'task:7' } });
    expect(cohortCoordinates({ _ng_rollout_index: 0 }).ok).toBe(false);
    expect(cohortCoordinates({ _ng_group_id: 'g', _ng_rollout_index: 'x' }).ok).toBe(false);
    expect(cohortCoordinates({ _ng_group_id: 'g', _ng_group_attempt: -1, _ng_rollout_index: 0 }).ok).toBe(false);
  });
});

describe('cohort registry', () => {
  it('a newer group attempt supersedes the older one', async () => {
    const reg = new CohortRegistry({ size: 2, collectionTimeoutMs: 5000, comparison: 'circular' });
    const old = reg.submit({ groupId: 'g', attempt: 0, slot: 0, promptId: 'p', text: 'Yes.' });
    const newer = reg.submit({ groupId: 'g', attempt: 1, slot: 0, promptId: 'p', text: 'Yes.' });
    expect(await old).toMatchObject({ ok: false, status: 503, code: 'cohort_superseded' });
    expect(await reg.submit({ groupId: 'g', attempt: 0, slot: 1, promptId: 'p', text: 'Yes.' })).toMatchObject({ ok: false, status: 409 });
    reg.submit({ groupId: 'g', attempt: 1, slot: 1, promptId: 'p', text: 'No.' });
    expect(await newer).toMatchObject({ ok: true });
    reg.close();
  });

  it('judge failure publishes a masked placeholder reward', async () => {
    const reg = new CohortRegistry({
      size: 1,
      collectionTimeoutMs: 5000,
      comparison: 'circular',
      score: () => {
        throw new Error('judge down');
      },
    });
    expect(await reg.submit({ groupId: 'g', attempt: 0, slot: 0, promptId: undefined, text: '' })).toEqual({
      ok: true,
      reward: 0,
      maskSample: true,
      failure: { kind: 'judge_failed', reason: 'judge down' },
    });
  });
});

describe('genrm_compare server', () => {
  it('a cohort of 3: every member waits for all, one reward each, published together; replays after completion', async () => {
    const app = await genrm({ num_rollouts_per_prompt: 3 });
    const texts = [GENRM_ANSWERS.answer_a, GENRM_ANSWERS.answer_b, GENRM_ANSWERS.answer_d];
    const clients = texts.map(() => new Client(app));
    const first = clients[0]!.post('/ng-rollout/g1-0/verify', verifyBody(0, texts[0]!));
    const second = clients[1]!.post('/ng-rollout/g1-1/verify', verifyBody(1, texts[1]!));
    expect(await settlesWithin(Promise.race([first, second]), 100)).toBe(false);
    // An identical retry of slot 0 attaches as an extra waiter.
    const retry = new Client(app).post('/ng-rollout/g1-0/verify', verifyBody(0, texts[0]!));
    // A different response for an occupied slot is a conflict.
    const clash = await new Client(app).post('/ng-rollout/g1-0/verify', verifyBody(0, GENRM_ANSWERS.answer_c));
    expect(clash.status).toBe(409);
    expect(clash.body.error.code).toBe('cohort_slot_conflict');
    expect(await settlesWithin(Promise.race([first, second, retry]), 50)).toBe(false);
    const third = await clients[2]!.post('/ng-rollout/g1-2/verify', verifyBody(2, texts[2]!));
    const replies = [await first, await second, third];
    const expected = cohortRewards(texts, 'circular');
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200]);
    expect(replies.map((r) => r.body.reward)).toEqual(expected);
    expect(replies[0]!.body).toMatchObject({ mask_sample: false, _ng_rollout_index: 0, prompt_id: 'p17' });
    expect((await retry).body.reward).toBe(expected[0]);
    // After completion an identical request (a replayed verify after a crash) replays the reward.
    const replay = await new Client(app).post('/ng-rollout/g1-1-a1/verify', verifyBody(1, texts[1]!));
    expect(replay.status).toBe(200);
    expect(replay.body.reward).toBe(expected[1]);
  });

  it('invalid coordinates → 422', async () => {
    const app = await genrm({ num_rollouts_per_prompt: 2 });
    const c = new Client(app);
    for (const extra of [{ _ng_rollout_index: 2 }, { _ng_rollout_index: -1 }, { _ng_group_id: undefined, _ng_rollout_index: 0 }, { _ng_group_id: '' }]) {
      const r = await c.post('/verify', verifyBody(0, 'x', extra));
      expect(r.status, JSON.stringify(extra)).toBe(422);
      expect(r.body.error.code).toBe('invalid_cohort_coordinates');
    }
  });

  it('a missing member fails the group with 503 after the collection timeout', async () => {
    const app = await genrm({ num_rollouts_per_prompt: 3, cohort_collection_timeout_s: 0.2 });
    const t0 = Date.now();
    const [a, b] = await Promise.all([
      new Client(app).post('/ng-rollout/x-0/verify', verifyBody(0, 'Yes.', { _ng_group_id: 'g2' })),
      new Client(app).post('/ng-rollout/x-1/verify', verifyBody(1, 'No.', { _ng_group_id: 'g2' })),
    ]);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
    for (const r of [a, b]) {
      expect(r.status).toBe(503);
      expect(r.body.error.code).toBe('cohort_not_collected');
      expect(r.body.error.detail).toMatch(/did not collect/);
    }
  });

  it('members are admitted during an open checkpoint (replayable) and do not block prepare', async () => {
    const app = await genrm({ num_rollouts_per_prompt: 2 });
    const a = new Client(app);
    const b = new Client(app);
    await a.post('/ng-rollout/m-0/seed_session', { resources_session_id: 'sa' });
    await b.post('/ng-rollout/m-1/seed_session', { resources_session_id: 'sb' });
    const first = a.post('/ng-rollout/m-0/verify', verifyBody(0, 'Yes.', { _ng_group_id: 'g3' }));
    const prep = await control(app, 'prepare', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect(prep.body.phase).toBe('prepared');
    const second = await b.post('/ng-rollout/m-1/verify', verifyBody(1, 'Yes, sure.', { _ng_group_id: 'g3' }));
    expect(second.status).toBe(200);
    expect((await first).body.reward).toBeGreaterThan(second.body.reward);
    // Their sessions end at resume, so this checkpoint still counted them.
    const s = await control(app, 'status');
    expect(s.body).toMatchObject({ mode: 'stateless', verify: 'replay', report: { counts: { sessions: 2 } } });
    await control(app, 'resume', { checkpoint_id: 'ck1', deadline_ts: soon() });
    expect((await control(app, 'status')).body.report.counts.sessions).toBe(0);
  });
});
