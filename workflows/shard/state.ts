// A rollout shard's state: the ledger slice of the prompt groups it owns, their attempts in flight,
// their deadlines, the reports not applied yet and what it owes the run. Carried across the
// shard's continue-as-new; a few hundred attempts at most (controller.rollouts_per_shard), so
// well under what one payload should carry.
import type { GymTopology, RolloutReport } from '../../protocol/controller.js';
import type { CaptureKey, EpisodeId } from '../../protocol/episode-id.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import type { Holds, ShardRequest } from '../messages.js';
import type { RecoveryPlan } from '../recovery-plan.js';

export interface InFlight {
  episode: EpisodeId;
  groupId: string;
  environment: string;
  workflowId: string;
  /** Told to stop (its deadline expired, or its cohort started over without it): signalled once. */
  stopSignalled: boolean;
  /** The stop signal did not reach it: it had ended already, without retiring anything. */
  stopUndelivered?: true;
  /**
   * Its completed report as its `/run` activity sent it, held because the attempt was told to stop:
   * it may be retiring that very attempt, so its own report decides (shard/reports.ts).
   */
  heldReport?: RolloutReport;
}

export interface ShardState {
  /** Its prompt groups (the cursor is the run's: unused here). */
  ledger: L.Ledger;
  inFlight: Record<CaptureKey, InFlight>;
  /** Rollout deadlines; their holders are the run's `Holds.deadlines`. */
  deadlines: D.DeadlineRegistry;
  /** The run's holds as last received (`seq` orders them). */
  holds: Holds;
  topology: GymTopology | null;
  /** Groups received from the run so far (the run tells unfinished from not yet seen by it). */
  assigned: number;
  /** Reports of its attempts received and not applied yet. */
  reports: RolloutReport[];
  /** Live failures not charged until the shard has looked at Gym (shard/reports.ts). */
  unconfirmedFailures: RolloutReport[];
  /** Requests not answered yet (a `drain` waits for the attempts in flight). */
  requests: ShardRequest[];
  /**
   * The IDs of the last requests answered (`ANSWERED_REQUESTS_KEPT`): a request sent again (a
   * checkpoint attempt's local activity runs again on a replay) is neither answered nor carried out twice.
   */
  answeredRequests: string[];
  /** What the next report to the run carries. */
  sealed: number[];
  completed: number;
  failed: number;
  /** A Gym crash noticed under its attempts (why), until the run's recovery settles the shard. */
  gymCrashed: string | null;
  /** The run has been told of it. */
  crashReported: boolean;
  /** Recoveries settled (`settleRecovery` requests). */
  epoch: number;
  /** Rollouts handed over for good (consumed groups, dead attempts of a recovery), to `forget` in Gym. */
  forgetQueue: string[];
  /** A recovery's plan of the shard's part, between `planRestore` and `settleRecovery`. */
  restorePlan: RecoveryPlan | null;
  /** The slice of a saved ledger it took over violates the ledger's invariants (a cold start refuses it). */
  loadError: string | null;
  closed: boolean;
}

export function initialShardState(run: string, holds: Holds): ShardState {
  return {
    ledger: L.emptyLedger(run),
    inFlight: {},
    deadlines: { ...D.emptyDeadlines(), holders: Object.fromEntries(holds.deadlines.map((h) => [h, 1])) },
    holds,
    topology: null,
    assigned: 0,
    reports: [],
    unconfirmedFailures: [],
    requests: [],
    answeredRequests: [],
    sealed: [],
    completed: 0,
    failed: 0,
    gymCrashed: null,
    crashReported: false,
    epoch: 0,
    forgetQueue: [],
    restorePlan: null,
    loadError: null,
    closed: false,
  };
}

export const ANSWERED_REQUESTS_KEPT = 64;

/** A request with this ID is waiting or was answered lately. */
export function knownRequest(st: ShardState, id: string): boolean {
  return st.requests.some((r) => r.id === id) || st.answeredRequests.includes(id);
}

/** Remembers an answered request's ID (the last `ANSWERED_REQUESTS_KEPT`). */
export function rememberAnswered(st: ShardState, id: string): void {
  st.answeredRequests.push(id);
  if (st.answeredRequests.length > ANSWERED_REQUESTS_KEPT) st.answeredRequests.splice(0, st.answeredRequests.length - ANSWERED_REQUESTS_KEPT);
}

/** Applies the run's holds (newer than the ones held): admission, and the deadline clock's holders. */
export function applyHolds(st: ShardState, holds: Holds): boolean {
  if (holds.seq <= st.holds.seq) return false;
  st.holds = holds;
  st.deadlines.holders = Object.fromEntries(holds.deadlines.map((h) => [h, 1]));
  return true;
}

export function admissionOpen(st: ShardState): boolean {
  return st.holds.admission.length === 0 && !st.closed;
}

/** The dataset position of a group (`<run>.p<index>`), the order training steps take groups in. */
export function groupIndex(group: L.PromptGroup): number {
  return group.task_ref?.prompt_index ?? Number(group.group_id.slice(group.group_id.lastIndexOf('.p') + 2));
}
