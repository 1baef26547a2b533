// Signals, queries and updates between the client, the training run and its children.
import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type { CaptureKey } from '../protocol/episode-id.js';
import type { CheckpointOutcome, GymTopology, RolloutReport } from '../protocol/controller.js';
import type { RolloutAttemptInput } from './rolloutAttempt.js';

/** A rollout attempt → its shard (by workflow ID, so it reaches the shard's current run after continue-as-new). */
export const rolloutFinished = defineSignal<[RolloutReport]>('rolloutFinished');
/** A rollout shard → the training run: the reports of its attempts, in batches. */
export const rolloutsFinished = defineSignal<[RolloutReport[]]>('rolloutsFinished');

/** What a shard needs to start one rollout attempt (the rest is the same for all: its input). */
export type AttemptStart = Pick<RolloutAttemptInput, 'episode' | 'environment' | 'environmentUrl' | 'expectedInstance' | 'task' | 'taskRef'> & {
  summary: string;
  details: string;
};
export interface AttemptStarts {
  attempts: AttemptStart[];
  /** The participants, which each attempt retires itself from (as discovered last). */
  topology: GymTopology;
}
/** The run → one rollout shard: start these attempts (already in the run's ledger as dispatched). */
export const startAttempts = defineSignal<[AttemptStarts]>('startAttempts');
/** The run → its rollout shards: the run ends; report what is left and stop. */
export const closeShard = defineSignal('closeShard');
/** The run → one rollout attempt: its deadline ran out (clocks are kept by the run). */
export const deadlineExpired = defineSignal('deadlineExpired');
/**
 * The run → one rollout attempt: stop now and report, for `reason` (its cohort starts over
 * without it). Like a deadline: the `/run` is cancelled and the attempt retired everywhere first.
 */
export const stopAttempt = defineSignal<[reason: string]>('stopAttempt');

export interface CheckpointCommitted {
  checkpointId: string;
  tmpDir: string;
  /**
   * Episodes the run had in flight at the checkpoint's start that Gym neither committed nor
   * reported as restarts: their `/run` replies may still be on the wire. Only these, not the
   * committed keys: at 8,000 in flight the full lists made this signal ~0.5 MB of history.
   */
  unsettled: CaptureKey[];
  /**
   * The attempt publishes with the run's early cut (`earlyLedgerCutWritten`, nothing unsettled):
   * the run need not confirm it. A confirmation that reached an attempt completing its workflow
   * failed that workflow task (a new event) and cost another (~60 ms at 8,000 in flight).
   */
  takesEarlyCut?: boolean;
}

export interface LedgerCutWritten {
  checkpointId: string;
  sha256: string;
  bytes: number;
  dataloaderCursor: number;
  baseTrainStep: number;
  trainerVersion: number;
}
export interface CheckpointPrepared {
  checkpointId: string;
  tmpDir: string;
}
/**
 * The checkpoint attempt → the run: Gym is prepared (frozen at its boundaries); write the ledger
 * cut now, beside the commit. `checkpointCommitted` then says whether that cut holds every result
 * it must, or the run writes it again.
 */
export const checkpointPrepared = defineSignal<[CheckpointPrepared]>('checkpointPrepared');
/** The checkpoint attempt → the run: Gym committed; write the controller's ledger cut now (or confirm the early one). */
export const checkpointCommitted = defineSignal<[CheckpointCommitted]>('checkpointCommitted');
/** The run → the checkpoint attempt: the ledger cut is in the temp snapshot directory. */
export const ledgerCutWritten = defineSignal<[LedgerCutWritten]>('ledgerCutWritten');
/**
 * The run → the checkpoint attempt: the early cut (written beside the commit) is in the temp
 * snapshot. It stands for certain when Gym committed every episode in flight at the attempt's
 * start (nothing unsettled): the attempt then publishes without asking the run again.
 */
export const earlyLedgerCutWritten = defineSignal<[LedgerCutWritten]>('earlyLedgerCutWritten');

export const pauseRun = defineSignal('pause');
export const resumeRun = defineSignal('resume');
export const stopRun = defineSignal('stop');

export interface RunStatus {
  run: string;
  phase: string;
  steps: number;
  cursor: number;
  inFlight: number;
  completedRollouts: number;
  failedRollouts: number;
  gates: { weightSync: boolean; gymCheckpoint: boolean };
  pendingRelease: string | null;
  pendingAbort: string | null;
  lastSnapshot: string | null;
  consecutiveFailures: number;
  /** Since when a recovery waits for Gym to answer again (ISO time), or null. */
  waitingForGymSince: string | null;
  checkpoints: CheckpointOutcome[];
  rewardPerStep: number[];
  continuedAsNew: number;
}
export const runStatus = defineQuery<RunStatus>('status');
/** Takes a checkpoint now and returns its outcome. */
export const checkpointNow = defineUpdate<CheckpointOutcome>('checkpointNow');
