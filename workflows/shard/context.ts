// What every part of a rollout shard shares within one execution: its input, its state, the
// activity proxies, and the flags its concurrent parts (main loop, deadline clock, handlers)
// coordinate through. Nothing here survives continue-as-new but `st`.
import { workflowInfo } from '@temporalio/workflow';
import type { FileDigest } from '../../protocol/controller.js';
import type { PackedJson } from '../../protocol/packed-json.js';
import {
  attemptStartActivities,
  controlActivities,
  gymProbeActivities,
  shardSignalLocalActivities,
  storageLocalActivities,
  type Activities,
  type LocalActivities,
} from '../activities-proxy.js';
import type { Holds } from '../messages.js';
import type { RolloutAttemptInput } from '../rolloutAttempt.js';
import type { InFlight, ShardState } from './state.js';

export interface RolloutShardInput {
  run: string;
  runWorkflowId: string;
  shard: number;
  /** How many shards the run has (a group's shard is `shardOf(group, shards)`). */
  shards: number;
  /** The settings every attempt it starts shares. */
  attempts: Pick<RolloutAttemptInput, 'controlTaskQueue' | 'runTaskQueue' | 'retireTimeoutS' | 'runHeartbeatTimeoutS' | 'scheduleToStartTimeoutS'>;
  /** Least time between two reports to the run: the run's signal rate stays bounded, however many shards. */
  flushIntervalMs: number;
  /** Continue-as-new past this many events. */
  maxHistoryEvents: number;
  /** `async_rl.max_attempts_per_sibling`, `async_rl.rollout_timeout_s`. */
  maxAttemptsPerSibling: number;
  rolloutTimeoutS: number | null;
  /** Where discovery finds the Gym (the shard looks at it after live failures). */
  gymRunDir: string;
  requireModel: boolean;
  /** Timeout of the Gym calls the shard makes itself (retire, forget). */
  gymTimeoutS: number;
  /** The run's holds when it started the shard. */
  holds: Holds;
  /** A ledger to take its slice of first (a cold start on a saved checkpoint). */
  load?: { dir: string; files: string[] } | { marker: string };
  /** Carried across continue-as-new, packed. */
  carried?: PackedJson;
}

export class ShardContext {
  readonly selfId = workflowInfo().workflowId;
  readonly control: Activities;
  readonly starts: Activities;
  readonly gymProbe: Activities;
  readonly files: LocalActivities;
  /** Answers go from a local activity (activities/shard-signals.ts). */
  readonly signals: LocalActivities;
  /** Something happened the main loop must look at. */
  changed = false;
  /** The deadline clock ticked past some deadline: signalExpired() looks. */
  expiryDue = false;
  /** In-flight attempts whose cohort started over without them: told to stop (shard/reports.ts). */
  toStop: InFlight[] = [];
  /** A report to the run went out less than `flushIntervalMs` ago (a timer, not the clock). */
  pacing = false;
  /** The attempts in flight when the last cut was written (a `recut` waits only if it matters). */
  lastCutInFlight = new Set<string>();
  lastCutPart: FileDigest | undefined;
  /** Live failures wait for the next look at Gym (the last was inconclusive: shard/live-failures.ts). */
  lookPaused = false;
  inconclusiveLooks = 0;

  constructor(
    readonly input: RolloutShardInput,
    readonly st: ShardState,
  ) {
    const placement = { taskQueue: input.attempts.controlTaskQueue, scheduleToStartTimeoutS: input.attempts.scheduleToStartTimeoutS };
    this.control = controlActivities(placement);
    this.starts = attemptStartActivities(placement);
    this.gymProbe = gymProbeActivities(placement);
    this.files = storageLocalActivities();
    this.signals = shardSignalLocalActivities();
  }

  wake(): void {
    this.changed = true;
  }
}
