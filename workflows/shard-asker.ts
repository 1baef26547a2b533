// Asking every rollout shard of a run for its part (messages.ts ShardRequest) and collecting the
// answers: one request/answer pair per shard for each exchange (a checkpoint's candidates and cut,
// a recovery's steps, a training step's batch). Used by the run and by its checkpoint attempts.
import { condition, getExternalWorkflowHandle, isCancellation, setHandler } from '@temporalio/workflow';
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
        try {
          await getExternalWorkflowHandle(shardWorkflowId(this.run, k)).signal(shardRequest, req);
        } catch (err) {
          if (isCancellation(err)) throw err;
          failed.set(ids[i]!, `shard ${k} could not be asked: ${String(err)}`);
        }
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

/** `0 … n-1`. */
export function allShards(n: number): number[] {
  return Array.from({ length: n }, (_, k) => k);
}
