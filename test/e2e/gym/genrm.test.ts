// A genrm prompt group caught at the cut (participants.md §4.10), as real processes: three
// siblings are in `/verify` waiting for their cohort (a replayable verify never holds up prepare)
// and the fourth is parked mid-turn (its model call held by the backend). After a crash the
// cohort re-forms in the fresh genrm_compare server from the replayed verifies and the continued
// sibling, and is scored once: every sibling gets exactly one reward, the same as uncrashed.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { promptGroups, siblingTask } from '../../../activities/dataset.js';
import type { Task } from '../../../protocol/tasks.js';
import {
  bringUp,
  cleanSlate,
  crash,
  crashAndRestore,
  deliveredNoResult,
  episode,
  forgetRollouts,
  prepareAndCommit,
  readRecords,
  replyOf,
  restart,
  rewardOf,
  startRun,
  status,
  tearDown,
  type Gym,
} from './harness.js';
import { sleep, waitFor } from '../../helpers/wait.js';

const ENV = 'genrm_env';
const SIZE = 4;

let gym: Gym | undefined;
const g = (): Gym => gym!;

beforeAll(async () => {
  gym = await bringUp('genrm');
});
afterAll(async () => {
  await tearDown(gym);
});
beforeEach(async () => {
  await cleanSlate(g());
});

describe('a genrm group caught at the cut', () => {
  it('re-forms after a restore and is scored once', async () => {
    const group = promptGroups({ seed: 5, cursor: 0, groups: 1, groupSize: SIZE, tasksets: ['genrm'] }).groups[0]!;
    const siblings = Array.from({ length: SIZE }, (_, k) => ({ rollout: `${group.group_id}-r${k}`, task: siblingTask(group, k) as Task }));
    const rollouts = siblings.map((s) => s.rollout);

    // Uncrashed run of the same group (one call per sibling), then fresh processes so that the
    // genrm server does not answer the crashed run from its completed cohort.
    const baseRuns = siblings.map((s) => startRun(g(), ENV, episode(s.rollout), s.task));
    const baseRewards = await Promise.all(baseRuns.map(async (r) => rewardOf(await replyOf(r))));
    expect((await g().backend.calls()).map((c) => c.rollout_id).sort()).toEqual([...rollouts].sort());
    await forgetRollouts(g(), rollouts);
    await crash(g());
    await restart(g());
    await g().backend.reset();

    // Siblings 0–2 answer and wait in /verify for their cohort …
    const runs = siblings.slice(0, 3).map((s) => startRun(g(), ENV, episode(s.rollout), s.task));
    for (const r of rollouts.slice(0, 3)) await g().backend.waitReturned(r, 1);
    await waitFor('three agent sessions closed', async () => (await status(g(), 'simple_agent')).report.counts.sessions === 0);
    await sleep(200);
    // … and sibling 3 is parked mid-turn: its model call is held.
    await g().backend.hold({ after_calls_per_rollout: 0 });
    runs.push(startRun(g(), ENV, episode(rollouts[3]!), siblings[3]!.task));
    await g().backend.waitForCalls(SIZE);
    expect(runs.some((r) => r.settled)).toBe(false);

    const ckpt = await prepareAndCommit(
      g(),
      'ckpt-genrm',
      rollouts.map((r) => episode(r)),
    );
    expect(ckpt.environmentKeys).toEqual([...rollouts].sort());
    const next = Object.fromEntries(readRecords(ckpt.dir, 'environment', ENV).map((r) => [r.episode_id.rollout_id, r.boundary.next]));
    expect(next).toEqual({ [rollouts[0]!]: 'verify', [rollouts[1]!]: 'verify', [rollouts[2]!]: 'verify', [rollouts[3]!]: 'invoke_agent' });
    expect(ckpt.replies.simple_agent!.episode_ids).toEqual([rollouts[3]]);

    await crashAndRestore(g(), runs, { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-genrm' });
    expect(runs.every(deliveredNoResult)).toBe(true);
    const replacements = siblings.map((s) => startRun(g(), ENV, episode(s.rollout, 1), s.task));
    const replies = await Promise.all(replacements.map((r) => replyOf(r)));
    // Exactly one reward per sibling, equal to the uncrashed group's.
    expect(replies.map(rewardOf)).toEqual(baseRewards);

    // Siblings 0–2 made no new call; sibling 3 made its held call once more.
    const calls = await g().backend.calls();
    for (const r of rollouts.slice(0, 3))
      expect(
        calls.filter((c) => c.rollout_id === r).map((c) => c.capture_key),
        r,
      ).toEqual([r]);
    expect(calls.filter((c) => c.rollout_id === rollouts[3]).map((c) => c.capture_key)).toEqual([rollouts[3], `${rollouts[3]}-a1`]);
    expect(calls).toHaveLength(SIZE + 1);
    await forgetRollouts(g(), rollouts);
  });
});
