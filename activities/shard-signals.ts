// The signals between a checkpoint attempt and the rollout shards of its run, sent by the worker's
// client instead of as workflow commands: the attempt's candidates request and the release of its
// holds to every shard, and each shard's answer. Why: the server carries out one workflow's signal
// commands one after another (each is a task of the sender's execution, which it locks to record
// the delivery), so the last shard heard that admission closed only after every other one, a wait
// that grows with the number of shards; and a signal command's delivery is recorded back in its
// sender, which then takes one more workflow task only to see it through. From a client each
// signal is one call into its target's execution, and they go at once.
// Safe to send twice (a replay runs a local activity again): a shard answers a request ID once
// (workflows/shard/state.ts `answeredRequests`), applies holds only when newer than its own, and an
// asker keeps one answer per request ID.
import { Context } from '@temporalio/activity';
import { WorkflowNotFoundError } from '@temporalio/common';
import type { FileDigest } from '../protocol/controller.js';
import { type WriteCandidatesInput, type WriteLedgerPartInput, writeCandidates, writeLedgerPart } from './controller-files.js';
import { activityClient } from './traced-client.js';
import { type Holds, type ShardAnswer, type ShardRequest, setHolds, shardAnswer, shardRequest } from '../workflows/messages.js';
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

/** Where a cut's files go (the controller's files; a test's fake Gym records them instead). */
export interface CutWriters {
  writeCandidates: (input: WriteCandidatesInput) => Promise<{ count: number }>;
  writeLedgerPart: (input: WriteLedgerPartInput) => Promise<FileDigest>;
}

export function createShardSignalActivities(files: CutWriters = { writeCandidates, writeLedgerPart }) {
  return {
    async signalShards(input: SignalShardsInput): Promise<SignalShardsOutcome> {
      const ctx = Context.current();
      const client = activityClient(ctx);
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

    /** A shard's answer to the workflow that asked; `delivered: false` when that workflow is gone (or could not be reached). */
    async answerShardRequest(input: { replyTo: string; answer: ShardAnswer }): Promise<AnswerDelivery> {
      return sendAnswer(input.replyTo, input.answer);
    },

    /**
     * A shard's answer to a checkpoint's candidates request: its candidates and its ledger part
     * written side by side, then the answer with their count and digest (or with why they could not
     * be written). One local activity, so the shard's workflow takes the fewest activations while
     * admission is closed. Both files are idempotent, and so is the answer (see above).
     */
    async answerWithCut(input: AnswerWithCutInput, ledgerJson: Uint8Array): Promise<AnswerDelivery & { count?: number; part?: FileDigest }> {
      const { tmpDir, shard, episodes } = input.cut;
      let cut: { count: number; part: FileDigest } | undefined;
      let failure: string | undefined;
      try {
        const [{ count }, part] = await Promise.all([
          files.writeCandidates({ tmpDir, shard, episodes }),
          files.writeLedgerPart({ dir: tmpDir, shard, ledger: ledgerJson }),
        ]);
        cut = { count, part };
      } catch (err) {
        failure = err instanceof Error ? err.message : String(err);
      }
      const delivery = await sendAnswer(input.replyTo, { ...input.answer, ...(cut ?? { error: failure }) });
      return { ...delivery, ...cut };
    },
  };
}

export interface AnswerDelivery {
  delivered: boolean;
  error?: string;
}

export interface AnswerWithCutInput {
  replyTo: string;
  answer: Pick<ShardAnswer, 'id' | 'shard'>;
  /** The ledger slice comes as the activity's second argument, its JSON text in UTF-8 (workflows/shard/requests.ts). */
  cut: WriteCandidatesInput;
}

async function sendAnswer(replyTo: string, answer: ShardAnswer): Promise<AnswerDelivery> {
  const ctx = Context.current();
  const handle = activityClient(ctx).workflow.getHandle(replyTo);
  // An asker that is not found has ended (it does not continue as new while it waits): nobody waits for the answer.
  const error = await sendWithRetries(() => handle.signal(shardAnswer, answer), ctx.cancellationSignal, false);
  return error === undefined ? { delivered: true } : { delivered: false, error };
}

/** The last error, or undefined once delivered. A workflow not found is tried again only with `retryNotFound` (a shard in its continue-as-new). */
async function sendWithRetries(send: () => Promise<void>, cancelled: AbortSignal, retryNotFound = true): Promise<string | undefined> {
  let last = '';
  for (let attempt = 1; attempt <= SIGNAL_ATTEMPTS && !cancelled.aborted; attempt++) {
    try {
      await send();
      return undefined;
    } catch (err) {
      last = String(err);
      if (err instanceof WorkflowNotFoundError && !retryNotFound) return last;
    }
    if (attempt < SIGNAL_ATTEMPTS) await new Promise((resolve) => setTimeout(resolve, RETRY_DELAY_MS));
  }
  return last;
}
