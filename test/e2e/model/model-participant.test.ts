// The policy model participant in a real Gym deployment (one process per server, started by the
// launcher; crashes are SIGKILLs of every Gym process group while the inference backend survives).
// Scenarios of participants.md §7 that belong to the model server: a checkpoint without a crash
// holds the reply; token lineage continues across a crash (and across a second restore of the
// same checkpoint); a generation cut is continued after a crash (and regenerated with cuts off);
// a retired attempt's waiting call is refused and leaves nothing behind.
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { forget, retire } from '../../../activities/coordination.js';
import { taskOf } from '../../../activities/dataset.js';
import { captureKey } from '../../../protocol/ids.js';
import {
  bringUp,
  captureKeysOnDisk,
  closeHttp,
  commitPrepared,
  controlPool,
  crash,
  deadline,
  episode,
  http,
  ledgerRows,
  modelStatus,
  prepareOnly,
  restartAndRestore,
  resumeAll,
  rewardOf,
  startRun,
  tearDown,
  type Gym,
} from './harness.js';
import { sleep, waitFor } from '../../helpers/wait.js';

let gym: Gym | undefined;
afterEach(async () => {
  await tearDown(gym);
  gym = undefined;
});
afterAll(async () => {
  await closeHttp();
  await controlPool.close();
});

const weatherTask = taskOf({ taskset: 'weather', city: 'SF' }, 'weather-sf');
const counterTask = taskOf({ taskset: 'counter', start: 3, target: 5 }, 'counter-3-5');

describe('policy model participant (real processes)', { timeout: 180_000 }, () => {
  it('a checkpoint without a crash: the reply arriving while Gym is prepared is held; no further call until resume', async () => {
    gym = await bringUp({ topology: 'weather' });
    await gym.backend.hold({ after_calls_per_rollout: 1 });
    const run = startRun(gym, episode('w1'), weatherTask);
    await gym.backend.waitForCalls(2);

    const prepared = await prepareOnly(gym, 'c1');
    expect(prepared.replies.policy_model!.report.counts).toMatchObject({ inflight: 1, held: 0 });
    // The backend answers while Gym is prepared: the model server holds the reply.
    await gym.backend.release();
    await waitFor('the held reply', async () => (await modelStatus(gym!)).report.counts.held === 1);
    expect((await gym.backend.calls())[1]!.returned).toBe(true);
    await sleep(400);
    expect(await gym.backend.calls()).toHaveLength(2);
    expect(run.settled).toBe(false);
    const committed = await commitPrepared(gym, 'c1', prepared, [episode('w1')]);
    expect(committed.replies.policy_model!.episode_ids).toEqual(['w1']);
    await resumeAll(gym, 'c1');

    expect(await rewardOf(run)).toBe(1);
    const calls = await gym.backend.calls();
    expect(calls.map((c) => [c.capture_key, c.n_messages])).toEqual([
      ['w1', 2],
      ['w1', 4],
    ]);
    const rows = ledgerRows(gym, 'w1');
    expect(rows.map((r) => r.model_call_id)).toEqual(calls.map((c) => c.model_call_id));
    expect(rows[1].parent_call_id).toBe(rows[0].model_call_id);
  });

  it('token lineage continues across a crash, and again when the same checkpoint is restored after the replacement made calls', async () => {
    gym = await bringUp({ topology: 'counter' });
    await gym.backend.hold({ after_calls_per_rollout: 1 });
    const run = startRun(gym, episode('ct'), counterTask);
    const [saved, lost] = await gym.backend.waitForCalls(2);
    const prepared = await prepareOnly(gym, 'c1');
    const committed = await commitPrepared(gym, 'c1', prepared, [episode('ct')]);
    const stagingKey = ledgerRows(gym, 'ct')[0].staging_key;
    expect(committed.replies.policy_model).toMatchObject({ episode_ids: ['ct'], staging_keys: [stagingKey], staging_keys_by_episode: { ct: [stagingKey] } });

    await crash(gym, [run]);
    await gym.backend.release();
    // The replacement makes one call, then its next one is held, and Gym crashes again.
    await gym.backend.hold({ after_calls_per_rollout: 3 });
    await restartAndRestore(gym, committed.dir, 'rs1', [episode('ct')]);
    const imported = await waitFor('the imported ledger file', () => (ledgerRows(gym!, 'ct-a1').length ? ledgerRows(gym!, 'ct-a1') : undefined));
    expect(imported).toEqual([expect.objectContaining({ model_call_id: saved!.model_call_id, capture_key: 'ct', parent_call_id: null })]);
    const replacement = startRun(gym, episode('ct', 1), counterTask);
    const calls = await gym.backend.waitForCalls(4);
    // The replacement's first call has the saved call as parent; the undelivered call is nowhere.
    expect(calls[2]!.capture_key).toBe('ct-a1');
    expect(calls[2]!.admission).toMatchObject({ parent_call_id: saved!.model_call_id, capture_key: 'ct-a1' });
    expect(calls[2]!.n_messages).toBe(lost!.n_messages);
    const lineage = await waitFor('the replacement call delivered', () => (ledgerRows(gym!, 'ct-a1').length === 2 ? ledgerRows(gym!, 'ct-a1') : undefined));
    expect(lineage.map((r) => r.parent_call_id)).toEqual([null, saved!.model_call_id]);
    expect(lineage.map((r) => r.model_call_id)).not.toContain(lost!.model_call_id);
    const deadRunCalls = lineage.slice(1).map((r) => r.model_call_id);

    await crash(gym, [replacement]);
    await gym.backend.release();
    await restartAndRestore(gym, committed.dir, 'rs2', [episode('ct')]);
    // Restoring the same checkpoint again: the dead replacement's rows and tokens are gone.
    await waitFor('the re-imported ledger', () => ledgerRows(gym!, 'ct-a1').length === 1 && captureKeysOnDisk(gym!).ledgers.join() === 'ct-a1');
    expect(ledgerRows(gym, 'ct-a1').map((r) => r.model_call_id)).toEqual([saved!.model_call_id]);
    expect(captureKeysOnDisk(gym).tokens).toEqual(['ct']);
    const again = startRun(gym, episode('ct', 1), counterTask);
    expect(await rewardOf(again)).toBe(1);
    const final = ledgerRows(gym, 'ct-a1');
    expect(final).toHaveLength(3);
    expect(final[1].parent_call_id).toBe(saved!.model_call_id);
    expect(final[2].parent_call_id).toBe(final[1].model_call_id);
    for (const id of [...deadRunCalls, lost!.model_call_id]) expect(final.map((r) => r.model_call_id)).not.toContain(id);
    // The calls after the second restore: exactly the two the checkpoint still needed.
    const after = (await gym.backend.calls()).slice(4);
    expect(after.map((c) => [c.capture_key, c.n_messages])).toEqual([
      ['ct-a1', lost!.n_messages],
      ['ct-a1', lost!.n_messages + 2],
    ]);
  });

  for (const cuts of [true, false]) {
    it(`a long generation undelivered at the checkpoint ${cuts ? 'is cut and its prefix continued after the crash' : 'regenerates from scratch with cuts off'}`, async () => {
      gym = await bringUp({ topology: 'weather', cuts, tokenDelayMs: 100 });
      const run = startRun(gym, episode('wc'), weatherTask);
      await waitFor('the answer decoding', async () => ((await gym!.backend.calls())[1]?.decoded_tokens ?? 0) >= 5);
      const prepared = await prepareOnly(gym, 'c1');
      const counts = prepared.replies.policy_model!.report.counts;
      expect(counts).toMatchObject({ inflight: 1, cut: cuts ? 1 : 0, cut_failed: 0 });
      const committed = await commitPrepared(gym, 'c1', prepared, [episode('wc')]);
      const original = (await gym.backend.calls())[1]!;
      expect(await gym.backend.cuts()).toEqual(cuts ? [[original.model_call_id]] : []);
      if (cuts) expect(committed.replies.policy_model!.staging_keys).toContain(`__generation_cut__/wc/${original.model_call_id}`);
      // Let the backend finish the dead call (its length tells how many tokens a full decode takes).
      await waitFor('the original decode finished', async () => (await gym!.backend.calls())[1]!.returned);
      const full = (await gym.backend.calls())[1]!.decoded_tokens;

      await crash(gym, [run]);
      await restartAndRestore(gym, committed.dir, 'rs1', [episode('wc')]);
      if (cuts) expect((await modelStatus(gym)).restored_generation_cuts).toEqual(['wc-a1']);
      const replacement = startRun(gym, episode('wc', 1), weatherTask);
      expect(await rewardOf(replacement)).toBe(1);
      const mine = (await gym.backend.calls()).filter((c) => c.capture_key === 'wc-a1');
      expect(mine).toHaveLength(1);
      if (cuts) {
        expect(mine[0]!.continued_from).toBe(original.model_call_id);
        expect(mine[0]!.reused_prefix_tokens).toBeGreaterThanOrEqual(5);
        expect(mine[0]!.decoded_tokens).toBe(full - mine[0]!.reused_prefix_tokens!);
      } else {
        expect(mine[0]!.continued_from).toBeUndefined();
        expect(mine[0]!.decoded_tokens).toBe(full);
      }
    });
  }

  it('a retired attempt: its waiting call gets stale_attempt, nothing is served after forget, its ledgers and tokens are gone', async () => {
    gym = await bringUp({ topology: 'weather' });
    await gym.backend.hold({ after_calls_per_rollout: 1 });
    const run = startRun(gym, episode('rt'), weatherTask);
    const [, lost] = await gym.backend.waitForCalls(2);
    const prepared = await prepareOnly(gym, 'c1');
    const committed = await commitPrepared(gym, 'c1', prepared, [episode('rt')]);
    await crash(gym, [run]);
    await gym.backend.release();
    expect(captureKeysOnDisk(gym)).toEqual({ ledgers: ['rt'], tokens: ['rt'] });

    let waiting: Promise<{ status: number; body: any }> | undefined;
    await restartAndRestore(gym, committed.dir, 'rs1', [episode('rt')], async (dep) => {
      // Restored, not yet resumed: a call of the replacement waits for admission…
      waiting = http('POST', `${gym!.url('policy_model')}/ng-rollout/rt-a1/v1/chat/completions`, {
        model: 'policy',
        messages: [{ role: 'user', content: 'x [task weather city=SF]' }],
      });
      await waitFor('the call waiting for admission', async () => (await modelStatus(gym!)).waiting_calls === 1);
      expect((await modelStatus(gym!)).report.counts.inflight).toBe(0);
      // …and the controller retires the replacement (with the restore's ID), then forgets the rollout.
      await retire(dep, { checkpointId: 'rs1', deadlineTs: deadline(), episodes: [episode('rt', 1)] });
      await forget(dep, { checkpointId: 'rs1', deadlineTs: deadline(), rolloutIds: ['rt'] });
    });
    const refused = await waiting!;
    expect(refused.status).toBe(409);
    expect(refused.body.error.code).toBe('stale_attempt');
    await sleep(300);
    const calls = await gym.backend.calls();
    expect(calls.filter((c) => c.rollout_id === 'rt').map((c) => captureKey({ rollout_id: c.rollout_id, attempt: c.attempt }))).toEqual(['rt', 'rt']);
    expect(calls.map((c) => c.model_call_id)).toContain(lost!.model_call_id);
    expect(captureKeysOnDisk(gym)).toEqual({ ledgers: [], tokens: [] });
    const s = await modelStatus(gym);
    expect(s).toMatchObject({ phase: 'idle', retired_rollouts: 0, restored_pending: [], restored_generation_cuts: [] });
    expect(s.report.counts.inflight).toBe(0);
  });
});
