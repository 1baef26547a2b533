// A restart next to a saved episode (participants.md §2.12, control-plane.md §11.3–11.7), as real
// processes: an episode over a restart-only resources server can never be captured, so it never
// holds up a checkpoint (even while its wait-mode verify is in flight) and is left out of every
// record; after a crash the controller retires its attempt and dispatches it again from its input
// as the next attempt, while the saved episode continues from its boundary.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { preparedRestarts, retire } from '../../../activities/coordination.js';
import { generateTasks } from '../../../activities/dataset.js';
import type { Task } from '../../../protocol/tasks.js';
import {
  baseline,
  bringUp,
  cleanSlate,
  crashAndRestore,
  deadline,
  deliveredNoResult,
  episode,
  forgetRollouts,
  nMessages,
  pickRollout,
  prepareAndCommit,
  readRecords,
  replyOf,
  rewardOf,
  startRun,
  status,
  tearDown,
  weatherSolved,
  type Gym,
} from './harness.js';
import { waitFor } from '../../helpers/wait.js';

const SAVED_ENV = 'weather_env';
const RESTART_ENV = 'restart_env';

let gym: Gym | undefined;
let task: Task;
const g = (): Gym => gym!;

beforeAll(async () => {
  gym = await bringUp('mixed');
  task = generateTasks({ seed: 7, count: 1, tasksets: ['weather'] })[0]!;
});
afterAll(async () => {
  await tearDown(gym);
});
beforeEach(async () => {
  await cleanSlate(g());
});

describe('a restart episode', () => {
  it('never holds up a checkpoint and starts over after a crash while a saved episode continues', async () => {
    const saved = pickRollout(task, 'saved', g().salt, weatherSolved(task));
    const restart = pickRollout(task, 'restart', g().salt, weatherSolved(task));
    const baseSaved = await baseline(g(), SAVED_ENV, saved, task);
    const baseRestart = await baseline(g(), RESTART_ENV, restart, task);
    expect([baseSaved.reward, baseRestart.reward]).toEqual([1, 1]);
    expect([baseSaved.nMessages, baseRestart.nMessages]).toEqual([
      [2, 4],
      [2, 4],
    ]);

    // The restart reaches its (slow, wait-mode) verify; the saved episode is held at its second call.
    const restartRun = startRun(g(), RESTART_ENV, episode(restart), task);
    await g().backend.waitReturned(restart, 2);
    await waitFor('the restart verifying', async () => (await status(g(), 'weather_restart_only')).report.counts.inflight === 1);
    await g().backend.hold({ after_calls_per_rollout: 1 });
    const savedRun = startRun(g(), SAVED_ENV, episode(saved), task);
    await g().backend.waitForCalls(4);

    const ckpt = await prepareAndCommit(g(), 'ckpt-mixed', [episode(saved), episode(restart)]);
    // Prepared and committed while the restart's verify is still in flight: it held nothing up.
    expect((await status(g(), 'weather_restart_only')).report.counts.inflight).toBe(1);
    expect(restartRun.settled).toBe(false);
    expect(preparedRestarts(ckpt.prepared)).toEqual([episode(restart)]);
    expect(ckpt.prepared.replies[RESTART_ENV]!.report.restarts).toEqual([restart]);
    expect(ckpt.scope).toEqual([episode(saved)]);
    expect(ckpt.environmentKeys).toEqual([saved]);
    expect(readRecords(ckpt.dir, 'environment', RESTART_ENV)).toEqual([]);
    expect(readRecords(ckpt.dir, 'environment', SAVED_ENV).map((r) => r.episode_id)).toEqual([episode(saved)]);
    expect(ckpt.replies.simple_agent!.episode_ids).toEqual([saved]);

    // After the crash: restore the saved episode, retire the restart's attempt everywhere (under
    // the restore's ID, before the resume), then dispatch both as attempt 1.
    await crashAndRestore(g(), [restartRun, savedRun], {
      dir: ckpt.dir,
      scope: ckpt.scope,
      restoreId: 'restore-mixed',
      beforeResume: async (dep) => {
        await retire(dep, { checkpointId: 'restore-mixed', deadlineTs: deadline(), episodes: [episode(restart)] });
      },
    });
    expect(deliveredNoResult(restartRun)).toBe(true);
    for (const name of [SAVED_ENV, RESTART_ENV, 'simple_agent', 'weather', 'weather_restart_only']) {
      expect((await status(g(), name)).retired_rollouts, name).toBeGreaterThanOrEqual(1);
    }

    const savedAgain = startRun(g(), SAVED_ENV, episode(saved, 1), task);
    const restartAgain = startRun(g(), RESTART_ENV, episode(restart, 1), task);
    expect(rewardOf(await replyOf(savedAgain))).toBe(1);
    expect(rewardOf(await replyOf(restartAgain))).toBe(1);

    const calls = await g().backend.calls();
    // Saved: continued at the held call. Restart: started over from its input.
    expect(nMessages(calls, saved)).toEqual([2, 4, 4]);
    expect(calls.filter((c) => c.rollout_id === saved).map((c) => c.capture_key)).toEqual([saved, saved, `${saved}-a1`]);
    expect(nMessages(calls, restart)).toEqual([2, 4, 2, 4]);
    expect(calls.filter((c) => c.rollout_id === restart).map((c) => c.capture_key)).toEqual([restart, restart, `${restart}-a1`, `${restart}-a1`]);

    await forgetRollouts(g(), [saved, restart]);
  });
});
