// Signals, queries and updates between the client, the training run, its rollout shards, its
// checkpoint attempts and the rollout attempts.
import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type { CheckpointOutcome, FileDigest, GymTopology, RolloutReport } from '../protocol/controller.js';
import type { CaptureKey, EpisodeId } from '../protocol/episode-id.js';
import type { ReserveInput, SealedOutcome } from './ledger.js';

// --- rollout attempt ↔ its shard -------------------------------------------------------------

/** A rollout attempt → its shard (by workflow ID, so it reaches the shard's current run after continue-as-new). */
export const rolloutFinished = defineSignal<[RolloutReport]>('rolloutFinished');
/** A worker → a shard: completed reports its `/run`s delivered, several in one signal (activities/report-batches.ts). */
export const rolloutsFinished = defineSignal<[RolloutReport[]]>('rolloutsFinished');
/**
 * A retried `/run` activity → its shard: did an earlier try's report seal this attempt? (Its worker
 * may have died between sending the report and completing the activity; activities/rollouts.ts.)
 */
export const sealedAttempt = defineQuery<SealedOutcome | null, [EpisodeId]>('sealedAttempt');
/** A shard → one of its rollout attempts: its deadline ran out (the shard keeps the clock). */
export const deadlineExpired = defineSignal('deadlineExpired');
/**
 * A shard → one of its rollout attempts: stop now and report, for `reason` (its cohort starts over
 * without it). Like a deadline: the `/run` is cancelled and the attempt retired everywhere first.
 */
export const stopAttempt = defineSignal<[reason: string]>('stopAttempt');

// --- the run → its shards ----------------------------------------------------------------------

/** New prompt groups for a shard to own: it reserves, dispatches, retries and seals their attempts. */
export interface AssignGroups {
  groups: ReserveInput[];
  /** The Gym as last discovered: environment URLs, process identities, the participants. */
  topology: GymTopology;
}
export const assignGroups = defineSignal<[AssignGroups]>('assignGroups');

/**
 * Who holds admission, the deadline clocks and the reports, as a whole (`seq` increases): a shard
 * dispatches only while `admission` is empty, counts ticks only while `deadlines` is, and reports
 * to the run only while `reports` is. Sent as the full set so signals that arrive out of order or
 * twice cannot leave a stale hold.
 */
export interface Holds {
  seq: number;
  admission: string[];
  deadlines: string[];
  reports: string[];
}
export const setHolds = defineSignal<[Holds]>('setHolds');

/**
 * The run's holders: a checkpoint attempt and a pending release/abort, a Gym recovery, a training
 * step, pause, stop; and the run's continue-as-new, which holds the reports (run/carry.ts).
 */
export const HOLDERS = {
  continueAsNew: 'run-continue-as-new',
  checkpoint: 'gym-checkpoint',
  recovery: 'gym-recovery',
  weightSync: 'weight-sync',
  paused: 'paused',
  stopping: 'stopping',
} as const;

/** The holds with `holder` released (the next sequence number). */
export function releasedHolds(h: Holds, holder: string): Holds {
  const without = (list: string[]) => list.filter((x) => x !== holder);
  return { seq: h.seq + 1, admission: without(h.admission), deadlines: without(h.deadlines), reports: without(h.reports) };
}

/** Holds under which Gym is mid-checkpoint or mid-recovery: no `forget` goes out then. */
export function gymBusy(h: Holds): boolean {
  return h.admission.includes(HOLDERS.checkpoint) || h.admission.includes(HOLDERS.recovery);
}

/** The run → its shards: the run ends; report what is left, forget what is done, and stop. */
export const closeShard = defineSignal('closeShard');

/**
 * A request to a shard (from the run or a checkpoint attempt), answered once with `shardAnswer`
 * to `replyTo` (a workflow ID). One request/answer pair for every exchange that needs every
 * shard's part: the cut of a checkpoint, a recovery's steps, a training step's batch.
 */
export type ShardRequest = { id: string; replyTo: string } & ShardRequestBody;

/** What a shard is asked to do. */
export type ShardRequestBody =
  /**
   * Take `holds` (the checkpoint's: dispatch nothing more) the moment the request arrives, then
   * write the episodes in flight (the scope's candidates) and the ledger part into the temp
   * snapshot. One signal closes the shard's admission and has it write its whole part of the cut.
   */
  | { kind: 'candidates'; tmpDir: string; holds: Holds }
  /** Gym did not commit these of the shard's candidates: wait briefly for their reports, then cut again. */
  | { kind: 'recut'; tmpDir: string; unsettled: CaptureKey[]; waitMs: number }
  /** Answer once no attempt of the shard is in flight (a recovery lets them report first). */
  /** Answered once nothing is in flight; with `forget`, once the finished rollouts are forgotten in Gym too (the run's end). */
  | { kind: 'drain'; forget?: boolean }
  /** Plan the shard's part of a restore from the last snapshot (or from `cold` start) into `dir`. */
  | { kind: 'planRestore'; snapshotDir: string | null; dir: string }
  /** Settle the shard's siblings after a restore (`dir` holds what it installed) and retire dead attempts. */
  | { kind: 'settleRecovery'; dir: string; restoreFailed: boolean; cold: boolean; topology: GymTopology }
  /** Hand over these sealed groups (by dataset position) for training step `step`: their batch part (when `batchFile`), then drop them. */
  | { kind: 'consume'; step: number; groups: number[]; batchFile: string | null }
  /** Write the ledger part into a trainer anchor's fallback parts directory. */
  | { kind: 'ledgerPart'; dir: string };
export const shardRequest = defineSignal<[ShardRequest]>('shardRequest');

export interface ShardAnswer {
  id: string;
  shard: number;
  /** Why the shard could not do it (the temp snapshot was discarded, …). */
  error?: string;
  /** `candidates`: episodes written; `planRestore`: scope entries written. */
  count?: number;
  /** `candidates`, `recut`, `ledgerPart`: the ledger part written. */
  part?: FileDigest;
  /** `consume`: the batch part, and the live rewards of the groups handed over. */
  batchFile?: string | null;
  rewardSum?: number;
  live?: number;
  /** `settleRecovery`: what became of the shard's unfinished siblings, and its groups now. */
  continued?: number;
  restarted?: number;
  /** Up to 100 of the continued siblings, by the capture key they go on as (reports and demos). */
  continuedKeys?: CaptureKey[];
  assigned?: number;
  unfinished?: number;
}
export const shardAnswer = defineSignal<[ShardAnswer]>('shardAnswer');

// --- shards → the run ------------------------------------------------------------------------

/** What a shard tells the run, in batches (at most every `flushIntervalMs`). */
export interface ShardReport {
  shard: number;
  /**
   * Groups sealed since the last report (every sibling sealed), by their position in the dataset
   * (the order steps take groups in): ready for a training step. Their results stay in the shard.
   */
  sealed: number[];
  /** Rollouts sealed with a result, and live failures charged, since the last report. */
  completed: number;
  failed: number;
  /** Groups received from the run so far (every `assignGroups`), attempts in flight, groups unfinished. */
  assigned: number;
  inFlight: number;
  unfinished: number;
  /** A Gym process restarted or is unreachable under the shard's attempts: the run recovers. */
  gymCrashed?: string;
  /** Recoveries the shard has settled: a crash it noticed before the last one was that one's. */
  epoch: number;
}
export const shardReport = defineSignal<[ShardReport]>('shardReport');

// --- the client → the run ----------------------------------------------------------------------

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
  shards: number;
}
export const runStatus = defineQuery<RunStatus>('status');
/** Takes a checkpoint now and returns its outcome. */
export const checkpointNow = defineUpdate<CheckpointOutcome>('checkpointNow');
