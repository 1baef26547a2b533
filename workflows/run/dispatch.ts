// The run's dispatch: prompt groups reserved from the dataset up to `max_in_flight_groups`
// unfinished, each handed to the rollout shard that owns it (`shardOf`), which reserves and starts
// its attempts.
import type { GymTopology } from '../../protocol/controller.js';
import { shardOf } from '../../protocol/controller.js';
import type { ReserveInput } from '../ledger.js';
import type { RunContext } from './context.js';
import { ensureShards, sendGroups } from './shards.js';
import { totalUnfinished } from './state.js';

/**
 * Groups per dataset read: read without their tasks, a group is ~100 bytes of result and ~300 of
 * signal to its shard, so a read stays far below Temporal's payload limits.
 */
const LOAD_BATCH_GROUPS = 256;

export async function dispatch(ctx: RunContext): Promise<void> {
  const { st, cfg } = ctx;
  if (!ctx.admissionOpen() || !st.topology) return;
  await ensureShards(ctx);
  const want = Math.min(cfg.async_rl.max_in_flight_groups - totalUnfinished(st), ctx.totalGroups - st.cursor);
  if (want <= 0) return;
  const loaded = await ctx.storage.loadPromptGroups({
    seed: cfg.run.seed,
    cursor: st.cursor,
    groups: Math.min(want, LOAD_BATCH_GROUPS),
    groupSize: cfg.grpo.num_generations_per_prompt,
    tasksets: cfg.grpo.tasksets,
    withoutTasks: true,
  });
  // A checkpoint or a crash may have closed admission while the dataset was read: the next pass assigns them.
  if (!ctx.admissionOpen()) return;
  if (loaded.groups.length < want) ctx.wake();
  const byShard = new Map<number, ReserveInput[]>();
  for (const g of loaded.groups) {
    const environment = cfg.grpo.environments[g.taskset] ?? `${g.taskset}_env`;
    // Run-scoped group ID: two runs on one Gym deployment never share a verification cohort.
    const groupId = `${cfg.run.name}.${g.group_id}`;
    const shard = shardOf(groupId, st.shards);
    if (!byShard.has(shard)) byShard.set(shard, []);
    byShard.get(shard)!.push({
      group_id: groupId,
      prompt_id: g.prompt_id,
      task_source: g.taskset,
      environment,
      recovery_granularity: st.levels?.[environment]?.recovery_granularity ?? 'sibling',
      restore_level: st.levels?.[environment]?.restore_level ?? cfg.rollout_recovery.target_level,
      target_step: Math.floor(st.cursor / cfg.grpo.num_prompts_per_step),
      tasks: [],
      size: g.size,
      task_ref: { group_id: groupId, seed: cfg.run.seed, prompt_index: g.prompt_index, group_size: g.size, tasksets: [...cfg.grpo.tasksets] },
    });
    st.cursor += 1;
  }
  const topology = shardTopology(st.topology);
  await Promise.all([...byShard].map(([shard, groups]) => sendGroups(ctx, shard, { groups, topology })));
}

/** What a shard needs of the topology: the participants, the environment servers and the process identities. */
export function shardTopology(t: GymTopology): GymTopology {
  return { members: t.members, servers: t.servers, fingerprint: t.fingerprint, instances: t.instances };
}
