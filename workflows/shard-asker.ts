// Asking every rollout shard of a run for its part (messages.ts ShardRequest) and collecting the
// answers: one request/answer pair per shard for each exchange (a checkpoint's candidates and cut,
// a recovery's steps, a training step's batch). Used by the run and by its checkpoint attempts.
import { condition, getExternalWorkflowHandle, isCancellation, setHandler, sleep } from '@temporalio/workflow';
import { shardAnswer, shardRequest, type ShardAnswer, type ShardRequest, type ShardRequestBody } from './messages.js';
import { shardWorkflowId } from './shard-id.js';

export class ShardAsker {
  private readonly answers = new Map<string, ShardAnswer>();

  /**
   * `prefix` and `nextSeq` make request IDs unique and the same on every replay (the run's
   * counter is in its state, so it survives continue-as-new).
   */
  constructor(
    private readonly run: string,
    private readonly nextSeq: () => number,
    private readonly replyTo: string = run,
    private readonly prefix: string = run,
  ) {
    setHandler(shardAnswer, (a) => {
      this.answers.set(a.id, a);
    });
  }

  /**
   * Sends each of `shards` its request and waits for every answer, at most `timeoutMs`. A shard
   * that cannot be signalled or does not answer in time gets an answer with `error` set.
   */
  async ask(shards: readonly number[], request: (shard: number) => ShardRequestBody, timeoutMs?: number): Promise<ShardAnswer[]> {
    const seq = this.nextSeq();
    const ids = shards.map((k) => `${this.prefix}/req-${seq}/${k}`);
    const failed = new Map<string, string>();
    await Promise.all(
      shards.map(async (k, i) => {
        const req = { ...request(k), id: ids[i]!, replyTo: this.replyTo } as ShardRequest;
        const err = await signalShard(shardWorkflowId(this.run, k), req);
        if (err !== undefined) failed.set(ids[i]!, `shard ${k} could not be asked: ${err}`);
      }),
    );
    const done = (): boolean => ids.every((id) => this.answers.has(id) || failed.has(id));
    if (timeoutMs === undefined) await condition(done);
    else await condition(done, timeoutMs);
    return ids.map((id, i) => {
      const a = this.answers.get(id);
      this.answers.delete(id);
      return a ?? { id, shard: shards[i]!, error: failed.get(id) ?? `shard ${shards[i]} did not answer within ${timeoutMs} ms` };
    });
  }
}

/**
 * A shard lives as long as its run, but a signal sent while it continues as new can find no
 * execution to deliver to (the time-skipping server reports "not found" in that moment), so a
 * refused signal is sent again a few times, a second apart, before the shard counts as lost.
 * Returns the last error, or undefined once delivered.
 */
async function signalShard(workflowId: string, req: ShardRequest): Promise<string | undefined> {
  let last = '';
  for (let attempt = 1; attempt <= SIGNAL_ATTEMPTS; attempt++) {
    try {
      await getExternalWorkflowHandle(workflowId).signal(shardRequest, req);
      return undefined;
    } catch (err) {
      if (isCancellation(err)) throw err;
      last = String(err);
    }
    if (attempt < SIGNAL_ATTEMPTS) await sleep(1000);
  }
  return last;
}
const SIGNAL_ATTEMPTS = 5;

/** `0 … n-1`. */
export function allShards(n: number): number[] {
  return Array.from({ length: n }, (_, k) => k);
}
