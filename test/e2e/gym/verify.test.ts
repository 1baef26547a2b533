// Verification in flight at a checkpoint (participants.md §7), as real processes over a weather
// server whose `/verify` takes VERIFY_MS:
// - `checkpoint_verify: replay`: prepare does not wait for it; the record is at `verify` and the
//   verify runs again after a restore;
// - `checkpoint_verify: wait`: prepare reports the environment blocker until it finished; the
//   record is at `return` and the verify is never re-run;
// - an episode whose (replayed) verify finishes while Gym is prepared parks at `return`: its
//   `/run` reply waits for the resume, or after a crash the replacement returns the recorded
//   result without verifying again.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { commit, prepare, preparedBlockers, resume } from '../../../activities/coordination.js';
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
  tearDown,
  weatherSolved,
  type Gym,
  type RunHandle,
} from './harness.js';
import { sleep, waitFor } from '../../helpers/wait.js';

/** `verify_delay_ms` of both weather servers in deployments/slow-verify.yaml. */
const VERIFY_MS = 3000;
const REPLAY_ENV = 'replay_env';
const WAIT_ENV = 'wait_env';

let gym: Gym | undefined;
let task: Task;
const g = (): Gym => gym!;
const solvedRollout = (prefix: string): string => pickRollout(task, prefix, g().salt, weatherSolved(task));

beforeAll(async () => {
  gym = await bringUp('slow-verify');
  task = generateTasks({ seed: 7, count: 1, tasksets: ['weather'] })[0]!;
});
afterAll(async () => {
  await tearDown(gym);
});
beforeEach(async () => {
  await cleanSlate(g());
});

/**
 * Starts the episode and returns once its `/verify` is in flight: both model calls returned and
 * the agent session is closed (the environment verifies right after), plus a moment.
 */
async function startUntilVerifying(env: string, rollout: string): Promise<{ run: RunHandle; verifyStartedAt: number }> {
  const run = startRun(g(), env, episode(rollout), task);
  await g().backend.waitReturned(rollout, 2);
  await waitFor('the agent session closed', async () => (await status(g(), 'simple_agent')).report.counts.sessions === 0);
  const verifyStartedAt = Date.now();
  await sleep(200);
  expect(run.settled).toBe(false);
  return { run, verifyStartedAt };
}

/** Runs the replacement and returns its reward and how long its `/run` took. */
async function timedReplacement(env: string, rollout: string): Promise<{ reward: number; ms: number }> {
  const t0 = Date.now();
  const reward = rewardOf(await runEpisode(g(), env, episode(rollout, 1), task));
  return { reward, ms: Date.now() - t0 };
}

describe('verification in flight', () => {
  it('is replayed: prepare does not wait, the record is at verify, the verify runs again after a restore', async () => {
    const rollout = solvedRollout('vreplay');
    const base = await baseline(g(), REPLAY_ENV, rollout, task);
    expect(base.reward).toBe(1);

    const { run, verifyStartedAt } = await startUntilVerifying(REPLAY_ENV, rollout);
    const ckpt = await prepareAndCommit(g(), 'ckpt-vreplay', [episode(rollout)]);
    // Prepared and committed while the verify still ran: the episode counts at the boundary
    // before it (a prepare that waited would have found it parked at `return`).
    expect(Date.now() - verifyStartedAt).toBeLessThan(VERIFY_MS);
    expect(run.settled).toBe(false);
    expect(readRecords(ckpt.dir, 'environment', REPLAY_ENV).map((r) => r.boundary.next)).toEqual(['verify']);

    await crashAndRestore(g(), [run], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-vreplay' });
    const again = await timedReplacement(REPLAY_ENV, rollout);
    expect(again.reward).toBe(base.reward);
    expect(again.ms).toBeGreaterThanOrEqual(VERIFY_MS - 100); // the verify ran once more
    expect(nMessages(await g().backend.calls())).toEqual(base.nMessages); // no model call redone
    await forgetRollouts(g(), [rollout]);
  });

  it('is waited for: prepare reports the environment blocker, the record is at return, the verify is not re-run', async () => {
    const rollout = solvedRollout('vwait');
    const base = await baseline(g(), WAIT_ENV, rollout, task);
    expect(base.reward).toBe(1);

    const run = startRun(g(), WAIT_ENV, episode(rollout), task);
    // A wait-mode verify counts as in flight on its resources server.
    await waitFor('the verify in flight', async () => (await status(g(), 'weather_wait')).report.counts.inflight === 1);
    const dep = await participants(g());
    const early = await prepare(dep, { checkpointId: 'ckpt-vwait-early', deadlineTs: deadline(0.3) });
    expect(early.prepared).toBe(false);
    expect(early.stoppedAt).toBe('environment');
    expect(preparedBlockers(early)).toMatchObject({ [WAIT_ENV]: [rollout] });
    await resume(dep, { checkpointId: 'ckpt-vwait-early', deadlineTs: deadline() });

    // A new prepare waits until the verify finished; the episode is then parked at `return`.
    const ckpt = await prepareAndCommit(g(), 'ckpt-vwait', [episode(rollout)]);
    expect(run.settled).toBe(false);
    const [record] = readRecords(ckpt.dir, 'environment', WAIT_ENV);
    expect(record!.boundary.next).toBe('return');
    expect(record!.boundary.result.reward).toBe(base.reward);

    await crashAndRestore(g(), [run], { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'restore-vwait' });
    const again = await timedReplacement(WAIT_ENV, rollout);
    expect(again.reward).toBe(base.reward);
    expect(again.ms).toBeLessThan(VERIFY_MS); // the recorded result, no second verify
    expect(nMessages(await g().backend.calls())).toEqual(base.nMessages);
    await forgetRollouts(g(), [rollout]);
  });
});

describe('an episode that finishes during prepare', () => {
  /** Prepared while the replayable verify runs; committed only after it finished. */
  async function finishWhilePrepared(rollout: string, id: string): Promise<{ run: RunHandle; dir: string }> {
    const { run, verifyStartedAt } = await startUntilVerifying(REPLAY_ENV, rollout);
    const dep = await participants(g());
    const prep = await prepare(dep, { checkpointId: id, deadlineTs: deadline() });
    expect(prep.prepared).toBe(true);
    expect(Date.now() - verifyStartedAt).toBeLessThan(VERIFY_MS);
    // The verify finishes while Gym is prepared: the episode parks at `return`, no reply yet.
    await sleep(verifyStartedAt + VERIFY_MS + 500 - Date.now());
    expect(run.settled).toBe(false);
    const dir = checkpointDir(g(), id);
    const replies = await commit(dep, { checkpointId: id, deadlineTs: deadline(), checkpointDir: dir, scope: [episode(rollout)] });
    expect(replies[REPLAY_ENV]!.episode_ids).toEqual([rollout]);
    const [record] = readRecords(dir, 'environment', REPLAY_ENV);
    expect(record!.boundary.next).toBe('return');
    await sleep(200);
    expect(run.settled).toBe(false);
    return { run, dir };
  }

  it('is delivered after the resume (no crash), and nothing is redone', async () => {
    const rollout = solvedRollout('fin');
    const base = await baseline(g(), REPLAY_ENV, rollout, task);
    const { run } = await finishWhilePrepared(rollout, 'ckpt-fin');
    const t0 = Date.now();
    await resumeAll(g(), 'ckpt-fin');
    const reply = await replyOf(run);
    expect(Date.now() - t0).toBeLessThan(VERIFY_MS);
    expect(rewardOf(reply)).toBe(base.reward);
    expect(nMessages(await g().backend.calls())).toEqual(base.nMessages);
    await forgetRollouts(g(), [rollout]);
  });

  it('is restored at return after a crash and not verified again', async () => {
    const rollout = solvedRollout('fincrash');
    const base = await baseline(g(), REPLAY_ENV, rollout, task);
    const { run, dir } = await finishWhilePrepared(rollout, 'ckpt-fincrash');
    await crashAndRestore(g(), [run], { dir, scope: [episode(rollout)], restoreId: 'restore-fincrash' });
    expect(deliveredNoResult(run)).toBe(true);
    const again = await timedReplacement(REPLAY_ENV, rollout);
    expect(again.reward).toBe(base.reward);
    expect(again.ms).toBeLessThan(VERIFY_MS);
    expect(nMessages(await g().backend.calls())).toEqual(base.nMessages);
    await forgetRollouts(g(), [rollout]);
  });
});
