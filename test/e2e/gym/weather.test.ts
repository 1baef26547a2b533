// The native topology (single_agent_turn + Simple Agent + weather) as real processes
// (participants.md §6.4, §7): an episode held at its second model call is checkpointed, every Gym
// process is SIGKILLed and fresh processes continue it from its last boundary; a checkpoint
// without a crash parks and resumes it; a retire stops it everywhere; a retried `/run` never
// runs an attempt twice. Expected calls come from a no-crash run of the same rollout (sampling is
// deterministic per rollout ID): uncrashed `[2, 4]`, crashed at the held second call `[2, 4, 4]`.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { commit, forget, prepare, retire } from '../../../activities/coordination.js';
import { generateTasks } from '../../../activities/dataset.js';
import type { Task } from '../../../protocol/tasks.js';
import {
  baseline,
  bringUp,
  cleanSlate,
  checkpointDir,
  crashAndRestore,
  deadline,
  deliveredNoResult,
  episode,
  forgetRollouts,
  http,
  nMessages,
  participants,
  pickRollout,
  prepareAndCommit,
  readRecords,
  replyOf,
  resumeAll,
  rewardOf,
  runEpisode,
  startRun,
  status,
  statuses,
  tearDown,
  weatherSolved,
  type Gym,
} from './harness.js';
import { sleep, waitFor } from '../../helpers/wait.js';

const ENV = 'weather_env';
let gym: Gym | undefined;
let task: Task;

const g = (): Gym => gym!;
/** A rollout ID whose uncrashed episode calls get_weather for the right city, then answers. */
const solvedRollout = (prefix: string): string => pickRollout(task, prefix, g().salt, weatherSolved(task));

beforeAll(async () => {
  gym = await bringUp('weather');
  task = generateTasks({ seed: 7, count: 1, tasksets: ['weather'] })[0]!;
});
afterAll(async () => {
  await tearDown(gym);
});
beforeEach(async () => {
  await cleanSlate(g());
});

describe('weather episodes (native topology)', () => {
  it('an episode continues from its last boundary after a crash', async () => {
    const rollout = solvedRollout('cont');
    const base = await baseline(g(), ENV, rollout, task);
    expect(base.reward).toBe(1);
    expect(base.nMessages).toEqual([2, 4]);

    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const ckpt = await prepareAndCommit(g(), 'ckpt-cont', [episode(rollout)]);
    expect(ckpt.environmentKeys).toEqual([rollout]);
    expect(readRecords(ckpt.dir, 'environment', ENV).map((r) => r.boundary.next)).toEqual(['invoke_agent']);

    const restored = await crashAndRestore(g(), [run], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-cont' });
    expect(deliveredNoResult(run)).toBe(true); // the first attempt's process died
    expect(restored[ENV]).toMatchObject({ phase: 'restored', source_checkpoint_id: 'ckpt-cont', restored: [`${rollout}-a1`] });
    const reply = await runEpisode(g(), ENV, episode(rollout, 1), task);
    expect(rewardOf(reply)).toBe(base.reward);

    // The held call is made once more by attempt 1; call 0 is never repeated.
    const calls = await g().backend.calls();
    expect(nMessages(calls)).toEqual([2, 4, 4]);
    expect(calls.map((c) => c.capture_key)).toEqual([rollout, rollout, `${rollout}-a1`]);
    expect(calls.map((c) => c.action)).toEqual([base.calls[0]!.action, base.calls[1]!.action, base.calls[1]!.action]);
    await forgetRollouts(g(), [rollout]);
  });

  it('a second crash before the replacement starts still continues', async () => {
    const rollout = solvedRollout('twice');
    const base = await baseline(g(), ENV, rollout, task);
    expect(base.nMessages).toEqual([2, 4]);

    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const first = await prepareAndCommit(g(), 'ckpt-twice-1', [episode(rollout)]);
    await crashAndRestore(g(), [run], { dir: first.dir, scope: first.scope, restoreId: 'restore-twice-1' });
    expect((await status(g(), ENV)).restored_pending).toEqual([`${rollout}-a1`]);

    // The unclaimed restored episode is checkpointed under its replacement attempt (N+1).
    const second = await prepareAndCommit(g(), 'ckpt-twice-2', [episode(rollout, 1)]);
    expect(second.environmentKeys).toEqual([`${rollout}-a1`]);
    expect(readRecords(second.dir, 'environment', ENV).map((r) => r.episode_id)).toEqual([{ rollout_id: rollout, attempt: 1 }]);
    await crashAndRestore(g(), [], { dir: second.dir, scope: second.scope, restoreId: 'restore-twice-2' });

    const reply = await runEpisode(g(), ENV, episode(rollout, 2), task);
    expect(rewardOf(reply)).toBe(base.reward);
    const calls = await g().backend.calls();
    expect(nMessages(calls)).toEqual([2, 4, 4]);
    expect(calls.map((c) => c.capture_key)).toEqual([rollout, rollout, `${rollout}-a2`]);
    await forgetRollouts(g(), [rollout]);
  });

  it('a checkpoint without a crash parks and then resumes the episode with no extra model call', async () => {
    const rollout = solvedRollout('park');
    const base = await baseline(g(), ENV, rollout, task);

    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const dep = await participants(g());
    const prep = await prepare(dep, { checkpointId: 'ckpt-park', deadlineTs: deadline() });
    expect(prep.prepared).toBe(true);

    // The backend answers while Gym is prepared: the policy model server holds the reply, the
    // agent stays parked at the boundary before the call, and no further call is made.
    await g().backend.release();
    await g().backend.waitReturned(rollout, 2);
    await waitFor('the model server holding the reply', async () => (await status(g(), 'policy_model')).report.counts.held === 1);
    await sleep(300);
    expect(await g().backend.count()).toBe(2);
    expect(run.settled).toBe(false);
    expect((await status(g(), 'simple_agent')).report.counts.at_boundary).toBe(1);

    await commit(dep, { checkpointId: 'ckpt-park', deadlineTs: deadline(), checkpointDir: checkpointDir(g(), 'ckpt-park'), scope: [episode(rollout)] });
    await sleep(200);
    expect(run.settled).toBe(false);
    await resumeAll(g(), 'ckpt-park');

    const reply = await replyOf(run);
    expect(rewardOf(reply)).toBe(base.reward);
    const calls = await g().backend.calls();
    expect(nMessages(calls)).toEqual(base.nMessages);
    expect(calls.map((c) => c.capture_key)).toEqual([rollout, rollout]);
    await forgetRollouts(g(), [rollout]);
  });

  it('a retired episode stops everywhere and leaves nothing behind', async () => {
    const rollout = solvedRollout('retire');
    for (const [name, s] of Object.entries(await statuses(g()))) expect(s.retired_rollouts, name).toBe(0);
    await g().backend.hold({ after_calls: 1 });
    const run = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);

    const dep = await participants(g());
    await retire(dep, { deadlineTs: deadline(), episodes: [episode(rollout)] });
    const stopped = await replyOf(run);
    expect(stopped.status).toBe(409);
    expect(stopped.body.error.code).toBe('stale_attempt');

    // Releasing the held call makes no further model call: the episode is gone.
    await g().backend.release();
    await sleep(400);
    expect(await g().backend.count()).toBe(2);

    const after = await statuses(g());
    expect(Object.keys(after).sort()).toEqual(['policy_model', 'simple_agent', 'weather', 'weather_env']);
    for (const [name, s] of Object.entries(after)) {
      expect(s.retired_rollouts, name).toBe(1);
      expect(s.report.restarts, name).toEqual([]);
      expect(s.report.blockers, name).toEqual([]);
      // episodes (environment), sessions and at_boundary (agent), inflight and sessions (resources)…
      expect(
        Object.values(s.report.counts).every((n) => n === 0),
        `${name} ${JSON.stringify(s.report.counts)}`,
      ).toBe(true);
    }
    expect(after.weather_env!.report.counts.episodes).toBe(0);
    expect(after.simple_agent!.report.counts.sessions).toBe(0);
    expect(after.weather!.report.counts).toMatchObject({ inflight: 0, sessions: 0 });

    const late = await http('POST', `${g().url(ENV)}/run`, { episode_id: episode(rollout), task });
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('stale_attempt');

    await forget(dep, { deadlineTs: deadline(), rolloutIds: [rollout] });
    for (const [name, s] of Object.entries(await statuses(g()))) {
      expect(s.retired_rollouts, name).toBe(0);
      expect(
        Object.values(s.report.counts).every((n) => n === 0),
        `${name} ${JSON.stringify(s.report.counts)}`,
      ).toBe(true);
    }
    const res = await status(g(), 'weather');
    expect(res.retired_sessions).toBe(0);
    expect(res.report.counts).toMatchObject({ inflight: 0, sessions: 0 });
    expect((await status(g(), 'simple_agent')).report.counts.sessions).toBe(0);
    expect((await status(g(), ENV)).report.counts.episodes).toBe(0);
  });

  it('a retried /run of a running and of a finished attempt returns the same reply without running it again', async () => {
    const rollout = solvedRollout('retry');
    const base = await baseline(g(), ENV, rollout, task);

    await g().backend.hold({ after_calls: 1 });
    const first = startRun(g(), ENV, episode(rollout), task);
    await g().backend.waitForCalls(2);
    const duplicate = startRun(g(), ENV, episode(rollout), task);
    await sleep(300);
    expect(first.settled || duplicate.settled).toBe(false);
    await g().backend.release();

    const a = await replyOf(first);
    const b = await replyOf(duplicate);
    expect(rewardOf(a)).toBe(base.reward);
    expect(b).toEqual(a);
    const calls = await g().backend.calls();
    expect(nMessages(calls)).toEqual(base.nMessages);

    const late = await runEpisode(g(), ENV, episode(rollout), task);
    expect(late).toEqual(a);
    expect(await g().backend.calls()).toEqual(calls);

    // A different task under the same attempt is refused rather than answered with the kept reply.
    const other = generateTasks({ seed: 8, count: 1, tasksets: ['weather'] })[0]!;
    const conflict = await http('POST', `${g().url(ENV)}/run`, { episode_id: episode(rollout), task: other });
    expect(conflict.status).toBe(409);
    expect(conflict.body.error.code).toBe('checkpoint_error');
    expect(await g().backend.count()).toBe(calls.length);
    await forgetRollouts(g(), [rollout]);
  });
});
