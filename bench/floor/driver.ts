// Runs the floor (bench/floor/workflows.ts) from the bench process: its own workers (a workflow
// bundle of the floor's two workflows, the controller's own `/run` activity), and a driver that
// keeps `inFlight` prompt groups of floor rollouts going, the next group starting when one
// finishes — the controller's dispatch rule, with nothing of the controller around it.
import { fileURLToPath } from 'node:url';
import type { Client } from '@temporalio/client';
import { NativeConnection, Worker, bundleWorkflowCode } from '@temporalio/worker';
import { closeActivityPools, createActivities, createActivityPools } from '../../activities/index.js';
import type { RunEpisodeInput } from '../../protocol/controller.js';
import type { Endpoints } from '../../servers/common/deployment.js';
import type { PlannedGroup } from '../lib/planned-groups.js';
import { limiter } from '../scale.js';
import { floorRollout } from './workflows.js';

const WORKFLOWS = fileURLToPath(new URL('./workflows.ts', import.meta.url));

export interface FloorWorkers {
  taskQueue: string;
  runTaskQueue: string;
  stop(): Promise<void>;
}

export async function startFloorWorkers(address: string, controlToken: string, maxConcurrentRollouts = 5_000): Promise<FloorWorkers> {
  const connection = await NativeConnection.connect({ address });
  const taskQueue = 'floor';
  const runTaskQueue = 'floor-run';
  const pools = createActivityPools();
  const { runEpisode } = createActivities({ controlToken, pools });
  const workflows = await Worker.create({
    connection,
    taskQueue,
    workflowBundle: await bundleWorkflowCode({ workflowsPath: WORKFLOWS, logger: undefined }),
    maxConcurrentWorkflowTaskExecutions: 64,
    // As the controller's attempt workflows (worker.ts): no cache, every poller on the shared queue.
    maxCachedWorkflows: 0,
  });
  const runs = await Worker.create({
    connection,
    taskQueue: runTaskQueue,
    activities: { runEpisode },
    maxConcurrentActivityTaskExecutions: maxConcurrentRollouts,
    maxConcurrentActivityTaskPolls: 20,
  });
  const running = Promise.all([workflows.run(), runs.run()]);
  return {
    taskQueue,
    runTaskQueue,
    async stop() {
      workflows.shutdown();
      runs.shutdown();
      await running;
      await Promise.all([connection.close(), closeActivityPools(pools)]);
    },
  };
}

/** The planned groups as the `/run` inputs of attempt 0 under run name `run`. */
export function floorEpisodes(planned: readonly PlannedGroup[], run: string, endpoints: Endpoints): RunEpisodeInput[][] {
  return planned.map((g) =>
    g.siblings.map((sib) => ({
      run,
      environment: g.environment,
      environmentUrl: endpoints[g.environment]!.url,
      episode: { rollout_id: sib.rollout_id, attempt: 0 },
      task: sib.task,
    })),
  );
}

/** How the bench starts one floor rollout (its workflow ID, queue and input). */
function startOptions(s: RunEpisodeInput, workers: FloorWorkers) {
  return {
    workflowId: `floor/${s.run}/${s.episode.rollout_id}`,
    taskQueue: workers.taskQueue,
    args: [{ ...s, runTaskQueue: workers.runTaskQueue }] as [RunEpisodeInput & { runTaskQueue: string }],
  };
}

/**
 * Starts every floor rollout without waiting for any to finish (the dispatch floor of
 * controller-scale), `concurrency` start calls at a time: thousands at once make the dev server
 * miss the calls' deadlines.
 */
export async function floorStart(client: Client, workers: FloorWorkers, episodes: readonly RunEpisodeInput[], concurrency = 100): Promise<void> {
  const limit = limiter(concurrency);
  await Promise.all(episodes.map((s) => limit(() => client.workflow.start(floorRollout, startOptions(s, workers)))));
}

/** Every group's floor rollouts, at most `inFlight` groups unfinished; the number that completed. */
export async function floorDriver(client: Client, workers: FloorWorkers, groups: RunEpisodeInput[][], inFlight: number): Promise<number> {
  let next = 0;
  let completed = 0;
  const lane = async (): Promise<void> => {
    while (next < groups.length) {
      const g = groups[next++]!;
      const results = await Promise.all(g.map((s) => client.workflow.execute(floorRollout, startOptions(s, workers))));
      completed += results.filter((r) => r.status === 'completed').length;
    }
  };
  await Promise.all(Array.from({ length: Math.min(inFlight, groups.length) }, lane));
  return completed;
}
