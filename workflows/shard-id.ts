// Workflow IDs of a run's rollout shards (`<run>/shard/<k>`).
export function shardWorkflowId(run: string, shard: number): string {
  return `${run}/shard/${shard}`;
}
