// Asking every rollout shard of a run for its part (messages.ts ShardRequest) and collecting the
// answers: one request/answer pair per shard for each exchange (a checkpoint's candidates and cut,
// a recovery's steps, a training step's batch). Used by the run and by its checkpoint attempts.
import { condition, getExternalWorkflowHandle, isCancellation, setHandler, sleep } from '@temporalio/workflow';
import { shardAnswer, shardRequest, type ShardAnswer, type ShardRequest, type ShardRequestBody } from './messages.js';
import { shardWorkflowId } from './shard-id.js';

/**
 * Sends each request to its shard; the shards it could not reach, with why. The default sends them
 * as this workflow's signal commands; a checkpoint attempt sends them from a local activity
 * (activities/shard-signals.ts: the server carries out one workflow's signal commands one after another).
 */
export type ShardSender = (requests: Array<{ shard: number; request: ShardRequest }>) => Promise<Array<{ shard: number; error: string }>>;

export class ShardAsker {
  private readonly answers = new Map<string, ShardAnswer>();

  /**
   * `prefix` and `nextSeq` make request IDs unique and the same on every replay (the run's
   * counter is in its state, so it survives continue-as-new).
   */
  constructor(
    run: string,
    private readonly nextSeq: () => number,
    private readonly replyTo: string = run,
    private readonly prefix: string = run,
    private readonly send: ShardSender = (requests) => signalEach(run, requests),
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
    const requests = shards.map((shard, i) => ({ shard, request: { ...request(shard), id: ids[i]!, replyTo: this.replyTo } as ShardRequest }));
    const failed = new Map<string, string>();
    for (const { shard, error } of await this.send(requests)) {
      failed.set(ids[shards.indexOf(shard)]!, `shard ${shard} could not be asked: ${error}`);
    }
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

async function signalEach(run: string, requests: Array<{ shard: number; request: ShardRequest }>): Promise<Array<{ shard: number; error: string }>> {
  const failed: Array<{ shard: number; error: string }> = [];
  await Promise.all(
    requests.map(async ({ shard, request }) => {
      const error = await signalShard(shardWorkflowId(run, shard), request);
      if (error !== undefined) failed.push({ shard, error });
    }),
  );
  return failed;
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
