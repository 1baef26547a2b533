// The floor the controller is measured against (bench/controller-overhead.ts): Temporal's own cost
// for the same rollouts run as the most trivial workflows — one workflow per rollout with one
// activity, its `/run`, started by the bench process (bench/floor/driver.ts) under the
// controller's dispatch rule, reporting by completing. No ledger, no checkpoints, no shards, no
// deadlines, no retire: what any Temporal program that runs a workflow per rollout pays at least.
import { proxyActivities } from '@temporalio/workflow';
import type { RunEpisodeInput } from '../../protocol/controller.js';

type FloorActivities = { runEpisode(input: RunEpisodeInput): Promise<{ status: string; reward: number | null }> };

export async function floorRollout(input: RunEpisodeInput & { runTaskQueue: string }): Promise<{ status: string; reward: number | null }> {
  const { runTaskQueue, ...episode } = input;
  const acts = proxyActivities<FloorActivities>({ taskQueue: runTaskQueue, startToCloseTimeout: '1 hour', retry: { maximumAttempts: 3 } });
  const r = await acts.runEpisode(episode);
  return { status: r.status, reward: r.reward };
}
