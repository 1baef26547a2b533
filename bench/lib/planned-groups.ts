// The rollouts of a run's first prompt groups, named and routed exactly as the controller does,
// for the benchmarks' drivers that run the same rollouts without it (plain HTTP, the floor).
import { loadPromptGroups } from '../../activities/loader.js';
import type { RunConfig } from '../../protocol/run-config.js';
import type { Task } from '../../protocol/tasks.js';
import { rolloutIdOf } from '../../workflows/ledger.js';

export interface PlannedGroup {
  groupId: string;
  environment: string;
  siblings: Array<{ rollout_id: string; task: Task }>;
}

/** The rollouts of a run's first `groups` prompt groups, exactly as the controller names and routes them. */
export async function plannedGroups(cfg: RunConfig, groups: number): Promise<PlannedGroup[]> {
  const loaded = await loadPromptGroups({
    seed: cfg.run.seed,
    cursor: 0,
    groups,
    groupSize: cfg.grpo.num_generations_per_prompt,
    tasksets: cfg.grpo.tasksets,
  });
  return loaded.groups.map((g) => {
    const groupId = `${cfg.run.name}.${g.group_id}`;
    return {
      groupId,
      environment: cfg.grpo.environments[g.taskset] ?? `${g.taskset}_env`,
      siblings: g.tasks.map((task, k) => ({ rollout_id: rolloutIdOf(groupId, k), task })),
    };
  });
}
