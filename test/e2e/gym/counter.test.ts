// The counter topology (resources state exported with the episode) as real processes
// (participants.md §7): the counter's restored state is what makes the continued episode reach
// reward 1.0, and the same checkpoint restores again after its replacement made calls (and
// incremented the counter) and crashed.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  baseline,
  bringUp,
  cleanSlate,
  crash,
  crashAndRestore,
  deliveredNoResult,
  episode,
  forgetRollouts,
  nMessages,
  prepareAndCommit,
  readRecords,
  restoreInto,
  rewardOf,
  runEpisode,
  solvedCounter,
  startRun,
  tearDown,
  type Gym,
} from './harness.js';

const ENV = 'counter_env';
let gym: Gym | undefined;
const g = (): Gym => gym!;

beforeAll(async () => {
  gym = await bringUp('counter');
});
afterAll(async () => {
  await tearDown(gym);
});
beforeEach(async () => {
  await cleanSlate(g());
});

describe('counter episodes (exported resources state)', () => {
  it("the counter's restored state is needed for reward 1.0", async () => {
    const { task, rollout } = solvedCounter(g(), 'state');
    const base = await baseline(g(), ENV, rollout, task);
    expect(base.reward).toBe(1);
    expect(base.nMessages.length).toBeGreaterThanOrEqual(3);

    // Held at call 1: the first increment is already in the counter's session state.
    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const ckpt = await prepareAndCommit(g(), 'ckpt-state', [episode(rollout)]);
    const [counterRecord] = readRecords(ckpt.dir, 'resources', 'counter');
    const data = task.task_input.task_data as { initial_count: number };
    const firstIncrement = base.calls[0]!.action === 'inc1' ? 1 : base.calls[0]!.action === 'inc2' ? 2 : 3;
    expect(counterRecord).toMatchObject({ episode_id: { rollout_id: rollout, attempt: 0 }, state: { count: data.initial_count + firstIncrement } });

    await crashAndRestore(g(), [run], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-state' });
    expect(rewardOf(await runEpisode(g(), ENV, episode(rollout, 1), task))).toBe(1);
    const continued = nMessages(await g().backend.calls());
    expect(continued).toEqual([...base.nMessages.slice(0, 2), ...base.nMessages.slice(1)]);

    // Negative control: the same checkpoint restored into everything but the counter server (it
    // comes up empty). The episode makes the very same calls, but its counter starts from nothing.
    await g().backend.reset();
    await crash(g());
    await restoreInto(g(), { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-state-without-counter', exclude: ['counter'] });
    expect(rewardOf(await runEpisode(g(), ENV, episode(rollout, 1), task))).toBe(0);
    expect(nMessages(await g().backend.calls())).toEqual(base.nMessages.slice(1));
    await forgetRollouts(g(), [rollout]);
  });

  it('the same checkpoint restores again after its replacement made calls and crashed', async () => {
    const { task, rollout } = solvedCounter(g(), 'again');
    const base = await baseline(g(), ENV, rollout, task);
    expect(base.reward).toBe(1);
    const B = base.nMessages;

    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const ckpt = await prepareAndCommit(g(), 'ckpt-again', [episode(rollout)]);
    await crashAndRestore(g(), [run], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-again-1' });

    // Attempt 1 makes its first call (and increments the restored counter), then is held at its
    // second call and dies with everything else.
    await g().backend.hold({ after_calls: 3 });
    const replacement = startRun(g(), ENV, episode(rollout, 1), task);
    await g().backend.waitForCalls(4);
    await crashAndRestore(g(), [replacement], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-again-2' });
    expect(deliveredNoResult(replacement)).toBe(true);

    // Restored from the same boundary: the dead run's calls and increment are not part of it.
    const reply = await runEpisode(g(), ENV, episode(rollout, 1), task);
    expect(rewardOf(reply)).toBe(base.reward);
    const calls = await g().backend.calls();
    expect(nMessages(calls)).toEqual([B[0], B[1], B[1], B[2], ...B.slice(1)]);
    expect(calls.map((c) => c.capture_key)).toEqual([rollout, rollout, ...calls.slice(2).map(() => `${rollout}-a1`)]);
    expect(calls.slice(4).map((c) => c.action)).toEqual(base.calls.slice(1).map((c) => c.action));
    await forgetRollouts(g(), [rollout]);
  });
});
