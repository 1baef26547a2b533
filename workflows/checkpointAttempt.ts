// One Gym-aware snapshot attempt (ID `<run>/checkpoint/<checkpoint_id>`). It ends in exactly one
// of publish + release, or abort, always with the same checkpoint ID (controller.md §2.2–2.4):
//   allocate → candidates + ledger parts (shards), beside the restart check → prepare → commit → [recut] → manifest → validate → publish → resume
// The candidates request closes admission in every shard (it carries the holds). A failure before publish
// aborts (resume with the same ID) and keeps the previous snapshot authoritative; a publish whose
// resume fails is `published_release_pending`. Retention is the run's.
import { log, setCurrentDetails, upsertSearchAttributes } from '@temporalio/workflow';
import {
  groupOfRollout,
  shardOf,
  type CheckpointOutcome,
  type CheckpointStageSeconds,
  type CheckpointTrigger,
  type FileDigest,
  type GymCommitOutcome,
  type GymTopology,
  type PublishedCounts,
  type SnapshotLocation,
  type SnapshotManifestSlim,
} from '../protocol/controller.js';
import { parseCaptureKey, type CaptureKey } from '../protocol/episode-id.js';
import {
  checkpointGymLocalActivities,
  type LocalActivities,
  checkpointProbeLocalActivities,
  shardSignalLocalActivities,
  storageActivities,
  storageLocalActivities,
} from './activities-proxy.js';
import { AttemptFailed, GymRestarted, classify, gymCall, requireAnswers } from './checkpoint-failure.js';
import { checkpointDetails, checkpointFailure } from './checkpoint-outcome.js';
import { describeFailure, unreachableServers } from './failures.js';
import { HOLDERS, releasedHolds, type Holds } from './messages.js';
import { ShardAsker, allShards, type ShardSender } from './shard-asker.js';
import { CHECKPOINT_OUTCOME, CHECKPOINT_REASON } from './search-attributes.js';

export interface CheckpointAttemptInput {
  run: string;
  checkpointId: string;
  trigger: CheckpointTrigger;
  topology: GymTopology;
  /** The run's rollout shards (each writes its candidates and its ledger part). */
  shards: number;
  /** The holds of this checkpoint: set in each shard by its candidates request, released by the attempt as soon as Gym resumes. */
  holds: Holds;
  /** The run's side of the cut, frozen while admission is closed. */
  cut: { dataloaderCursor: number; baseTrainStep: number; trainerVersion: number };
  /** How long a shard waits for results already on the wire before it cuts again (`controller.late_result_wait_ms`). */
  lateResultWaitMs: number;
  checkpointDir: string;
  anchor: string;
  prepareTimeoutS: number;
  controlTaskQueue: string;
  /** `controller.schedule_to_start_timeout_s`. */
  scheduleToStartTimeoutS: number;
  /** Where the Gym's endpoints are (to check that no participant restarted since discovery). */
  gymRunDir: string;
  requireModel: boolean;
}

export async function checkpointAttempt(input: CheckpointAttemptInput): Promise<CheckpointOutcome> {
  const placement = { taskQueue: input.controlTaskQueue, scheduleToStartTimeoutS: input.scheduleToStartTimeoutS };
  const storage = storageActivities(placement);
  // Everything while admission is closed runs as local activities in this worker (allocation, the
  // restart check, Gym's prepare, commit and resume, publication): neither a server round trip and
  // workflow task each nor publication's input lands in the history.
  const control = checkpointGymLocalActivities();
  const files = storageLocalActivities();
  const discovery = checkpointProbeLocalActivities(input.prepareTimeoutS);
  const id = input.checkpointId;
  let asked = 0;
  // The shards hear the requests from a local activity, all at once (activities/shard-signals.ts).
  const signals = shardSignalLocalActivities();
  const send: ShardSender = async (requests) => (await signals.signalShards({ run: input.run, requests })).failed;
  const shards = new ShardAsker(input.run, () => ++asked, checkpointWorkflowId(input.run, id), id, send);
  const everyShard = allShards(input.shards);
  const shardTimeoutMs = Math.max(30, input.prepareTimeoutS) * 1000;
  const seconds: CheckpointStageSeconds = {};
  const t0 = Date.now();
  // The stage in the UI's current details (a query answer: no history event while admission is closed).
  const stage = (name: string): void => {
    setCurrentDetails(`**${input.trigger} checkpoint** \`${id}\` of run \`${input.run}\`\n\nstage: **${name}**`);
  };
  const timed = async <T>(key: keyof CheckpointStageSeconds, fn: () => Promise<T>): Promise<T> => {
    const s = Date.now();
    try {
      return await fn();
    } finally {
      seconds[key] = (seconds[key] ?? 0) + (Date.now() - s) / 1000;
    }
  };
  const finish = async (o: Omit<CheckpointOutcome, 'checkpointId' | 'trigger' | 'seconds' | 'at'>): Promise<CheckpointOutcome> => {
    seconds.total = (Date.now() - t0) / 1000;
    seconds.gym_participant_seconds = (seconds.prepare ?? 0) + (seconds.commit ?? 0) + (seconds.resume ?? 0);
    const outcome: CheckpointOutcome = { checkpointId: id, trigger: input.trigger, seconds, at: new Date().toISOString(), ...o };
    upsertSearchAttributes([
      { key: CHECKPOINT_OUTCOME, value: outcome.outcome },
      { key: CHECKPOINT_REASON, value: outcome.reason },
    ]);
    setCurrentDetails(checkpointDetails(outcome, input.run));
    // A failed attempt fails its workflow (the UI's "Failed" list); the run reads the same outcome from the failure.
    if (outcome.outcome === 'failed') throw checkpointFailure(outcome);
    return outcome;
  };

  let location: SnapshotLocation | undefined;
  let prepared = false;
  let commit: GymCommitOutcome | undefined;
  let restarts: CaptureKey[] = [];
  const abandon = async (err: unknown): Promise<CheckpointOutcome> => {
    // Nothing was published: drop the temp snapshot, abort Gym with the same ID.
    const reason = err instanceof AttemptFailed ? err.reason : classify(err);
    const message = describeFailure(err);
    const gymRestarted = err instanceof GymRestarted;
    const gymUnreachable = err instanceof AttemptFailed && err.gymUnreachable;
    if (location) await storage.discardSnapshot({ tmpDir: location.tmpDir }).catch(() => undefined);
    let abortPending = false;
    if (prepared) {
      stage('abort');
      abortPending = !(await resumeGym(control, input, seconds));
    }
    const releasedAtMs = abortPending ? undefined : await releaseShards(input);
    return finish({
      ...(releasedAtMs !== undefined ? { releasedAtMs } : {}),
      outcome: 'failed',
      reason,
      error: message,
      abortPending,
      gymRestarted,
      ...(gymUnreachable ? { gymUnreachable } : {}),
      ...(commit ? { scopeCount: commit.scopeCount } : {}),
      restartCount: restarts.length,
    });
  };
  let published: { location: SnapshotLocation; counts: PublishedCounts };
  try {
    // The snapshot's directory first: the shards write their parts into it.
    stage('allocate');
    location = await timed('allocate', () => files.allocateSnapshot({ checkpointDir: input.checkpointDir, anchor: input.anchor, checkpointId: id }));
    const tmpDir = location.tmpDir;
    // Admission closes in each shard with this request (it carries the checkpoint's holds), and
    // every shard has answered before Gym prepares: no `/run` dispatched before the hold can find
    // Gym prepared and be left out of the candidates. Each shard writes its ledger part with them.
    // The restart check goes side by side with it: a participant that restarted fresh holds none
    // of the episodes in flight, and a snapshot now would publish a cut that continues nothing.
    stage('candidates');
    const [checked, asked] = await timed('candidates', () =>
      Promise.allSettled([restartCheck(discovery, input), shards.ask(everyShard, () => ({ kind: 'candidates', tmpDir, holds: input.holds }), shardTimeoutMs)]),
    );
    if (checked.status === 'rejected') throw checked.reason;
    if (asked.status === 'rejected') throw asked.reason;
    const candidates = asked.value;
    const parts = new Map(requireAnswers('candidates', candidates).map((a) => [a.shard, a.part!]));

    stage('prepare');
    // From the first prepare call on, Gym may hold admission closed under this ID: the fan-out goes
    // stage by stage, so a prepare that fails on one server has prepared the ones before it. Every
    // exit aborts or releases it (a resume where prepare never arrived only fences the ID).
    prepared = true;
    const prep = await timed('prepare', () =>
      gymCall(() =>
        control.gymPrepare.executeWithOptions({ summary: `prepare ${id}` }, [{ topology: input.topology, checkpointId: id, timeoutS: input.prepareTimeoutS }]),
      ),
    );
    if (!prep.prepared) throw new AttemptFailed('timeout', `Gym not ready by the prepare deadline; blockers: ${JSON.stringify(prep.blockers).slice(0, 500)}`);
    restarts = prep.restarts;

    stage('commit');
    commit = await timed('commit', () =>
      gymCall(() =>
        control.gymCommit.executeWithOptions({ summary: `commit ${id}` }, [
          { topology: input.topology, checkpointId: id, timeoutS: input.prepareTimeoutS, checkpointDir: tmpDir, scope: { shards: input.shards, restarts } },
        ]),
      ),
    );

    // Episodes in flight when the shards wrote their parts that no environment committed: they
    // ended before Gym's cut, their `/run` replies are on the wire. Their shards cut again once
    // they have them (or after a short wait).
    const unsettled = unsettledByShard(commit.uncommitted, input.shards);
    if (unsettled.size > 0) {
      stage('ledger cut');
      const again = await timed('ledger_cut', () =>
        shards.ask([...unsettled.keys()], (k) => ({ kind: 'recut', tmpDir, unsettled: unsettled.get(k)!, waitMs: input.lateResultWaitMs }), shardTimeoutMs),
      );
      for (const a of requireAnswers('ledger cut', again)) parts.set(a.shard, a.part!);
    }

    stage('publish');
    const manifest: SnapshotManifestSlim = {
      schema_version: 2,
      format: 'rollout-checkpoint/ts',
      run: input.run,
      checkpoint_id: id,
      sequence: location.sequence,
      base_train_step: input.cut.baseTrainStep,
      trainer_version: input.cut.trainerVersion,
      dataloader_cursor: input.cut.dataloaderCursor,
      gym_topology_fingerprint: input.topology.fingerprint,
      // The finalize names the commit file (the scope and each participant's episode IDs) with its digest.
      gym_checkpoint: { restarts, participants: commit.participants },
      ledger_parts: everyShard.map((k): FileDigest => parts.get(k)!),
      created_at: new Date().toISOString(),
    };
    await timed('publish', () => files.finalizeSnapshot({ location: location!, manifest, fingerprint: input.topology.fingerprint }));
    published = { location, counts: { scopeCount: commit.scopeCount, restartCount: restarts.length } };
  } catch (err) {
    // A worker that died after publishing, before the workflow task that published completed,
    // leaves the next one to run the task's local activities again: those before publication then
    // fail against what is done (the temp snapshot renamed, Gym resumed). Published all the same.
    const counts = location ? await files.snapshotPublishedBy({ location, checkpointId: id }).catch(() => null) : null;
    if (!location || !counts) return abandon(err);
    log.warn('the snapshot was published before this failure (a replay after a worker death): it stands', { checkpointId: id, error: describeFailure(err) });
    published = { location, counts };
  }

  // Published: the snapshot is durable and authoritative from here on. Retention (older
  // snapshots) is the run's, once it has the outcome and admission is open again.
  stage('resume');
  const released = await resumeGym(control, input, seconds);
  const releasedAtMs = released ? await releaseShards(input) : undefined;
  return finish({
    ...(releasedAtMs !== undefined ? { releasedAtMs } : {}),
    outcome: released ? 'completed' : 'failed',
    reason: released ? 'completed' : 'release_pending',
    releasePending: !released,
    snapshotDir: published.location.finalDir,
    sequence: published.location.sequence,
    ...published.counts,
  });
}

export function checkpointWorkflowId(run: string, checkpointId: string): string {
  return `${run}/checkpoint/${checkpointId}`;
}

/**
 * Gym resumed: the shards may dispatch again at once, not one round trip through the run later. The
 * run adopts the same holds when it has the outcome (it changes none while the attempt runs).
 */
async function releaseShards(input: CheckpointAttemptInput): Promise<number> {
  const holds = releasedHolds(input.holds, HOLDERS.checkpoint);
  const at = Date.now();
  // Best effort: a shard not reached gets the same holds from the run with the outcome.
  await shardSignalLocalActivities()
    .signalShards({ run: input.run, holds: { shards: allShards(input.shards), holds } })
    .catch(() => undefined);
  return at;
}

/** Fails the attempt when Gym is unreachable or a participant restarted since the run discovered it. */
async function restartCheck(discovery: ReturnType<typeof checkpointProbeLocalActivities>, input: CheckpointAttemptInput): Promise<void> {
  const now = await discovery
    .discoverGym({ runDir: input.gymRunDir, requireModel: input.requireModel, probeTimeoutS: input.prepareTimeoutS })
    .catch((err: unknown) => {
      const down = unreachableServers(err);
      if (down.length > 0) throw new AttemptFailed('io_error', `Gym unreachable: ${down.join(', ')}`, true);
      throw err;
    });
  const restarted = Object.entries(input.topology.instances ?? {})
    .filter(([name, instance]) => now.instances[name] !== instance)
    .map(([name]) => name);
  if (restarted.length > 0) throw new GymRestarted(`Gym processes restarted since discovery: ${restarted.sort().join(', ')}`);
}

/** The uncommitted capture keys by the shard that owns them. */
function unsettledByShard(keys: readonly CaptureKey[], shards: number): Map<number, CaptureKey[]> {
  const out = new Map<number, CaptureKey[]>();
  for (const key of keys) {
    const k = shardOf(groupOfRollout(parseCaptureKey(key)?.rollout_id ?? key), shards);
    out.set(k, [...(out.get(k) ?? []), key]);
  }
  return out;
}

/** Resume (release or abort) with the same ID; false when it failed (pending, retried later). */
async function resumeGym(control: LocalActivities, input: CheckpointAttemptInput, seconds: CheckpointStageSeconds): Promise<boolean> {
  const s = Date.now();
  try {
    await control.gymResume.executeWithOptions({ summary: `resume ${input.checkpointId}` }, [
      { topology: input.topology, checkpointId: input.checkpointId, timeoutS: input.prepareTimeoutS },
    ]);
    return true;
  } catch {
    return false;
  } finally {
    seconds.resume = (seconds.resume ?? 0) + (Date.now() - s) / 1000;
  }
}
