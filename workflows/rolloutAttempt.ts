// One physical attempt of one sibling (ID `<run>/rollout/<capture key>`): POST `/run` under the
// attempt's capture key; when its deadline fires (the run keeps the clocks and signals us) or the
// run fails, the attempt is retired everywhere, caller first, BEFORE we report — so nothing of it
// runs on. The report goes to the attempt's rollout shard by workflow ID (which survives the
// shard's continue-as-new); the shard relays it to the run in a batch. A completed `/run`'s report
// is signalled by the activity itself (nothing to retire first), which saves the attempt a task.
import { CancellationScope, condition, getExternalWorkflowHandle, isCancellation, setHandler, sleep, upsertSearchAttributes } from '@temporalio/workflow';
import type { GymTopology, RolloutReport, TaskRef } from '../protocol/controller.js';
import { captureKey, type EpisodeId } from '../protocol/episode-id.js';
import { controlActivities, runActivities } from './activities-proxy.js';
import { describeFailure, failureType } from './failures.js';
import { deadlineExpired, rolloutFinished, stopAttempt } from './messages.js';
import { ROLLOUT_REWARD, ROLLOUT_STATUS } from './search-attributes.js';

/** The reason a rollout reports when its environment process restarted under it. */
export const GYM_RESTARTED = 'gym_restarted';

export interface RolloutAttemptInput {
  run: string;
  /** The workflow its report goes to: its rollout shard. */
  reportTo: string;
  episode: EpisodeId;
  environment: string;
  environmentUrl: string;
  /** The environment process that owns this attempt (a fresh process refuses it). */
  expectedInstance?: string;
  task?: unknown;
  taskRef?: TaskRef;
  topology: GymTopology;
  controlTaskQueue: string;
  runTaskQueue: string;
  retireTimeoutS: number;
  /** `controller.run_heartbeat_timeout_s`. */
  runHeartbeatTimeoutS: number;
  /** `controller.schedule_to_start_timeout_s`. */
  scheduleToStartTimeoutS: number;
}

export async function rolloutAttempt(input: RolloutAttemptInput): Promise<RolloutReport> {
  const key = captureKey(input.episode);
  const started = Date.now();
  /** Why the run stopped this attempt (its deadline, or its cohort started over), if it did. */
  let stopped: { status: RolloutReport['status']; reason: string } | undefined;
  setHandler(deadlineExpired, () => {
    stopped ??= { status: 'timed_out', reason: 'rollout deadline expired' };
  });
  setHandler(stopAttempt, (reason) => {
    stopped ??= { status: 'retired', reason };
  });
  const runActs = runActivities({ taskQueue: input.runTaskQueue, scheduleToStartTimeoutS: input.scheduleToStartTimeoutS }, input.runHeartbeatTimeoutS);
  const control = controlActivities({ taskQueue: input.controlTaskQueue, scheduleToStartTimeoutS: input.scheduleToStartTimeoutS });

  const scope = new CancellationScope();
  const run = scope.run(() =>
    runActs.runEpisode.executeWithOptions({ summary: `/run ${key} on ${input.environment}` }, [
      {
        run: input.run,
        environment: input.environment,
        environmentUrl: input.environmentUrl,
        episode: input.episode,
        ...(input.taskRef ? { taskRef: input.taskRef } : { task: input.task }),
        ...(input.expectedInstance ? { expectedInstance: input.expectedInstance } : {}),
        reportTo: input.reportTo,
      },
    ]),
  );
  let outcome: { report?: RolloutReport; error?: unknown } | undefined;
  void run.then(
    (report) => (outcome = { report }),
    (error: unknown) => (outcome = { error }),
  );
  await condition(() => outcome !== undefined || stopped !== undefined);

  let report: RolloutReport;
  const seconds = (): number => (Date.now() - started) / 1000;
  if (outcome?.report) {
    report = outcome.report;
  } else if (outcome === undefined) {
    // Deadline (or stopped by the run): cancel the HTTP call (the activity aborts its request) and
    // retire the attempt. The cancellation reaches the activity only with its next heartbeat reply,
    // up to 0.8 × the heartbeat timeout away; the retire makes the environment cancel the episode's
    // task at once, so `/run` ends now either way. The report still waits until the activity ended.
    scope.cancel();
    await retireEverywhere(control, input);
    await run.catch(() => undefined);
    report = failedReport(input.episode, stopped!.status, stopped!.reason, false, seconds());
  } else {
    const code = failureType(outcome.error);
    if (code === 'stale_attempt') {
      // Someone (a restore, an earlier retire) already fenced this attempt everywhere.
      report = failedReport(input.episode, 'retired', 'attempt was retired', false, seconds());
    } else if (code === 'instance_mismatch') {
      // The environment restarted fresh: nothing of this attempt runs there; the run recovers it.
      report = failedReport(input.episode, 'failed', GYM_RESTARTED, false, seconds());
    } else {
      await retireEverywhere(control, input);
      report = failedReport(input.episode, 'failed', describeFailure(outcome.error), code !== undefined && code !== 'gym_transient', seconds());
    }
  }
  // Status and reward in the workflow list (the Temporal UI, the chaos checks), without opening each one.
  upsertSearchAttributes([{ key: ROLLOUT_STATUS, value: report.status }, ...(report.reward !== null ? [{ key: ROLLOUT_REWARD, value: report.reward }] : [])]);
  // A completed `/run` signalled its report itself (activities/rollouts.ts): the attempt ends here,
  // unless it was told to stop, when its shard holds that report until it hears the attempt's own.
  if (!report.reported || stopped !== undefined) {
    const { reported: _activitySent, ...own } = report;
    await getExternalWorkflowHandle(input.reportTo).signal(rolloutFinished, own);
  }
  return report;
}

/** Retire caller first; a checkpoint that is open refuses it (`invalid_phase`), so wait and retry. */
async function retireEverywhere(control: ReturnType<typeof controlActivities>, input: RolloutAttemptInput): Promise<void> {
  const key = captureKey(input.episode);
  for (let i = 0; ; i++) {
    try {
      await CancellationScope.nonCancellable(() =>
        control.gymRetire.executeWithOptions({ summary: `retire ${key}` }, [
          { topology: input.topology, timeoutS: input.retireTimeoutS, episodes: [input.episode] },
        ]),
      );
      return;
    } catch (err) {
      if (isCancellation(err)) throw err;
      const code = failureType(err);
      if (code !== 'invalid_phase' && code !== 'gym_transient' && code !== 'deadline_exceeded') throw err;
      // A checkpoint is open (or Gym is briefly unreachable): retry after it resumes.
      await sleep(Math.min(30_000, 1_000 * 2 ** Math.min(i, 5)));
    }
  }
}

function failedReport(episode: EpisodeId, status: RolloutReport['status'], reason: string, terminal: boolean, seconds: number): RolloutReport {
  return { captureKey: captureKey(episode), episode, status, reward: null, terminal, reason, result: null, seconds };
}

export function rolloutWorkflowId(run: string, episode: EpisodeId): string {
  return `${run}/rollout/${captureKey(episode)}`;
}
