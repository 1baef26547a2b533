// The lifecycle of one `/run` (participants.md §2.7) plus our idempotent-`/run` extension:
// duplicate check → concurrency slot → episode deadline → begin → stages → (rule 3 hold) →
// finishing → final cleanup (shielded, newest-first) → end → reply.
import { isProtocolError, refuse, type ProtocolError } from '../../protocol/errors.js';
import { captureKey, type CaptureKey } from '../../protocol/ids.js';
import { RunReplySchema, taskDigest, type RunFailure, type RunRequest, type RunResult } from '../../protocol/tasks.js';
import type { AttemptReplies, FinishedRun, RunOutcome } from './attempt-replies.js';
import { CleanupStack } from './cleanup-stack.js';
import type { Slots } from '../common/async.js';
import { EpisodeCancelled } from './episode-steps.js';
import { EpisodeTimedOut, FAILURE_REASON_MAX, HandledFailure } from './failures.js';
import type { EnvironmentParticipant } from './participant.js';
import { PausableDeadline } from './pausable-deadline.js';
import { SingleAgentTurn, type EpisodeControl, type TurnPeers } from './single-agent-turn.js';

export interface RunnerLog {
  warn(obj: unknown, msg?: string): void;
  error(obj: unknown, msg?: string): void;
}

export interface EpisodeRunnerOptions {
  participant: EnvironmentParticipant;
  replies: AttemptReplies;
  peers: TurnPeers;
  slots: Slots | undefined;
  queueTimeoutMs: number | null;
  episodeTimeoutMs: number | null;
  cleanupTimeoutMs: number;
  log: RunnerLog;
}

export class EpisodeRunner {
  constructor(private readonly o: EpisodeRunnerOptions) {}

  /**
   * One `/run`. A retired attempt is refused; a duplicate of a running attempt joins it; a finished
   * one gets its kept reply; otherwise the attempt's one execution starts. Refusals of a duplicate
   * check throw (the app renders the envelope); everything else is an outcome.
   */
  async run(req: RunRequest): Promise<RunOutcome> {
    const key = captureKey(req.episode_id);
    if (this.o.participant.isRetired(req.episode_id)) {
      throw refuse('stale_attempt', `attempt ${key} was retired`);
    }
    const digest = taskDigest(req.task);
    const found = this.o.replies.lookup(key);
    if (found) {
      if (found.kind === 'evicted') {
        throw refuse('checkpoint_error', `attempt ${key} already ran and its reply is no longer kept`);
      }
      if (found.digest !== digest) {
        throw refuse('checkpoint_error', `attempt ${key} ${found.kind === 'running' ? 'is running' : 'ran'} with a different task`);
      }
      return found.reply;
    }
    // No await since the lookup: this is the attempt's only execution.
    return this.o.replies.start(key, digest, () => this.execute(req, key, digest));
  }

  private async execute(req: RunRequest, key: CaptureKey, digest: string): Promise<FinishedRun> {
    const { slots } = this.o;
    if (slots && !(await slots.acquire(this.o.queueTimeoutMs))) {
      return {
        outcome: { status: 200, body: failureReply(req, { failure_reason: 'Episode admission timed out', terminal: false, stage: 'admission' }) },
        keep: false,
      };
    }
    try {
      return await this.admitted(req, key, digest);
    } catch (err) {
      this.o.log.error({ err, episode: key }, 'environment run failed outside the episode');
      return { outcome: { status: 200, body: failureReply(req, unhandled(err)) }, keep: false };
    } finally {
      slots?.release();
    }
  }

  private async admitted(req: RunRequest, key: CaptureKey, digest: string): Promise<FinishedRun> {
    const { participant } = this.o;
    const steps = participant.steps;
    const abort = new AbortController();
    const deadline = new PausableDeadline(this.o.episodeTimeoutMs, () => abort.abort(new EpisodeTimedOut()));
    let ended!: () => void;
    const done = new Promise<void>((resolve) => (ended = resolve));

    let continuation;
    try {
      continuation = participant.begin(req.episode_id, digest, {
        deadline,
        cancel: () => abort.abort(new EpisodeCancelled(key)),
        done,
      });
    } catch (err) {
      deadline.cancel();
      ended();
      if (isProtocolError(err)) return { outcome: { refusal: err }, keep: false };
      throw err;
    }

    const signal = abort.signal;
    const ctl: EpisodeControl = {
      key,
      signal,
      boundary: (b) => steps.boundary(key, b, signal),
      step: (mode, work) => steps.step(key, mode, work),
      markRestart: () => steps.markRestart(key, signal),
      awaitRelease: () => steps.awaitRelease(key),
    };
    const cleanup = new CleanupStack(this.o.cleanupTimeoutMs, (msg, err) => this.o.log.warn({ err, episode: key }, msg));
    const turn = new SingleAgentTurn(this.o.peers, req, ctl, cleanup, continuation);

    let result: RunResult | undefined;
    let failure: RunFailure | undefined;
    let refused: ProtocolError | undefined;
    try {
      try {
        result = await turn.run();
      } catch (err) {
        // The deadline or a retire stopped the episode: that, not the error it caused, decides.
        const reason: unknown = signal.aborted ? signal.reason : err;
        if (reason instanceof EpisodeTimedOut) failure = { failure_reason: 'Episode timed out', terminal: false };
        else if (reason instanceof EpisodeCancelled) refused = refuse('stale_attempt', `attempt ${key} was retired`);
        else if (reason instanceof HandledFailure) failure = reason.failure;
        else {
          this.o.log.error({ err: reason, episode: key }, 'unhandled environment server error');
          failure = unhandled(reason);
        }
      } finally {
        deadline.cancel();
      }
      // Rule 3: an episode a checkpoint still counts at a boundary cleans up only after the resume.
      await steps.awaitRelease(key);
      steps.finishing(key);
      await cleanup.unwind();
    } finally {
      participant.end(key);
      ended();
    }

    if (refused) return { outcome: { refusal: refused }, keep: false };
    const body = result ? successReply(req, result) : failureReply(req, turn.evidence(failure!));
    const checked = RunReplySchema.safeParse(body);
    const outcome: RunOutcome = checked.success
      ? { status: 200, body }
      : { status: 200, body: failureReply(req, unhandled(new Error(`reply does not match the protocol: ${checked.error.issues[0]?.message}`))) };
    // A reply produced while a retire waited for the final cleanup is not kept: the mark refuses.
    return { outcome, keep: !participant.isRetired(req.episode_id) };
  }
}

function successReply(req: RunRequest, result: RunResult): Record<string, unknown> {
  return { episode_id: req.episode_id, task_id: req.task.task_id, result, failure: null };
}

function failureReply(req: RunRequest, failure: RunFailure): Record<string, unknown> {
  const f: Record<string, unknown> = { ...failure, failure_reason: failure.failure_reason.slice(0, FAILURE_REASON_MAX) };
  for (const k of ['stage', 'failure_kind'] as const) if (f[k] === undefined || f[k] === null) delete f[k];
  return { episode_id: req.episode_id, task_id: req.task.task_id, result: null, failure: f };
}

function unhandled(err: unknown): RunFailure {
  const name = err instanceof Error ? err.name : 'Error';
  const msg = err instanceof Error ? err.message : String(err);
  return { failure_reason: `Unhandled environment server error: ${name}: ${msg}`.slice(0, FAILURE_REASON_MAX), terminal: true };
}
