// A checkpoint attempt's signals to every rollout shard of its run (its candidates request, then
// the release of its holds), sent by the worker's client side by side. Why not as the attempt's
// own signal commands: the server carries out one workflow's signal commands one after another
// (each is a task of the sender's execution, which it locks to record the delivery), so the last
// shard heard that admission closed only after every other one, a wait that grows with the number
// of shards. From a client each signal is one call into its shard's execution, and they go at once.
// Safe to send twice (a replay runs a local activity again): a shard answers a request ID once
// (workflows/shard/state.ts `answeredRequests`), and applies holds only when newer than its own.
import { Context } from '@temporalio/activity';
import { type Holds, type ShardRequest, setHolds, shardRequest } from '../workflows/messages.js';
import { shardWorkflowId } from '../workflows/shard-id.js';

export interface SignalShardsInput {
  run: string;
  /** Requests, each to its shard. */
  requests?: Array<{ shard: number; request: ShardRequest }>;
  /** Or the same holds to each of these shards. */
  holds?: { shards: number[]; holds: Holds };
}

export interface SignalShardsOutcome {
  /** The shards no signal reached after every try, with the last error. */
  failed: Array<{ shard: number; error: string }>;
}

/**
 * A shard lives as long as its run, but a signal sent in the moment it continues as new can find
 * no execution (the time-skipping test server says "not found" then): a refused signal is sent
 * again a few times, a second apart, before the shard counts as not reached.
 */
const SIGNAL_ATTEMPTS = 5;
const RETRY_DELAY_MS = 1_000;

export function createShardSignalActivities() {
  return {
    async signalShards(input: SignalShardsInput): Promise<SignalShardsOutcome> {
      const ctx = Context.current();
      const client = ctx.client;
      const sends: Array<{ shard: number; send: () => Promise<void> }> = [
        ...(input.requests ?? []).map(({ shard, request }) => ({
          shard,
          send: () => client.workflow.getHandle(shardWorkflowId(input.run, shard)).signal(shardRequest, request),
        })),
        ...(input.holds?.shards ?? []).map((shard) => ({
          shard,
          send: () => client.workflow.getHandle(shardWorkflowId(input.run, shard)).signal(setHolds, input.holds!.holds),
        })),
      ];
      const failed: SignalShardsOutcome['failed'] = [];
      await Promise.all(
        sends.map(async ({ shard, send }) => {
          const error = await sendWithRetries(send, ctx.cancellationSignal);
          if (error !== undefined) failed.push({ shard, error });
        }),
      );
      return { failed: failed.sort((a, b) => a.shard - b.shard) };
    },
  };
}

/** The last error, or undefined once delivered. */
async function sendWithRetries(send: () => Promise<void>, cancelled: AbortSignal): Promise<string | undefined> {
  let last = '';
  for (let attempt = 1; attempt <= SIGNAL_ATTEMPTS && !cancelled.aborted; attempt++) {
    try {
      await send();
      return undefined;
    } catch (err) {
      last = String(err);
    }
    if (attempt < SIGNAL_ATTEMPTS) await new Promise((resolve) => setTimeout(resolve, RETRY_DELAY_MS));
  }
  return last;
}
