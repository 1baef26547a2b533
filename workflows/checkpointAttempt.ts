// One Gym-aware snapshot attempt (ID `<run>/checkpoint/<checkpoint_id>`). It ends in exactly one
// of publish + release, or abort, always with the same checkpoint ID (controller.md §2.2–2.4):
//   prepare → commit → ledger cut (by the run) → manifest → validate → publish → resume (retention: the run)
// A failure before publish aborts (resume with the same ID) and keeps the previous snapshot
// authoritative; a publish whose resume fails is `published_release_pending`.
import {
  ApplicationFailure,
  condition,
  getExternalWorkflowHandle,
  setCurrentDetails,
  setHandler,
  upsertMemo,
} from '@temporalio/workflow';
import type {
  CheckpointOutcome,
  CheckpointReason,
  CheckpointStageSeconds,
  CheckpointTrigger,
  GymCommitOutcome,
  GymTopology,
  SnapshotLocation,
  SnapshotManifestSlim,
} from '../protocol/controller.js';
import { captureKey, type EpisodeId } from '../protocol/episode-id.js';
import { controlActivities, controlLocalActivities, storageActivities, storageLocalActivities } from './activities-proxy.js';
import { describeFailure, failureType, unreachableServers } from './failures.js';
import { checkpointCommitted, checkpointPrepared, earlyLedgerCutWritten, ledgerCutWritten, type LedgerCutWritten } from './messages.js';

export interface CheckpointAttemptInput {
  run: string;
  runWorkflowId: string;
  checkpointId: string;
  trigger: CheckpointTrigger;
  topology: GymTopology;
  /** Episodes the controller has in flight (dispatched, `/run` not replied yet). */
  inFlight: EpisodeId[];
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

/** The Gym restarted under the controller: the attempt ends, the run recovers. */
class GymRestarted extends Error {}

/** A failure of this attempt, classified for the pump (controller.md §2.8). */
class AttemptFailed extends Error {
  constructor(
    readonly reason: CheckpointReason,
    message: string,
    /** A participant could not be reached: Gym is down, not failing; the run waits for it. */
    readonly gymUnreachable = false,
  ) {
    super(message);
  }
}


export async function checkpointAttempt(input: CheckpointAttemptInput): Promise<CheckpointOutcome> {
  const placement = { taskQueue: input.controlTaskQueue, scheduleToStartTimeoutS: input.scheduleToStartTimeoutS };
  const control = controlActivities(placement);
  const storage = storageActivities(placement);
  // Allocation, the restart check and publication are short file or status reads: local
  // activities in this worker, so neither a server round trip and workflow task each nor
  // publication's input (the scope's keys) lands in the history while admission is closed.
  const files = storageLocalActivities();
  const discovery = controlLocalActivities();
  const id = input.checkpointId;
  const seconds: CheckpointStageSeconds = {};
  const t0 = Date.now();
  let cut: LedgerCutWritten | undefined;
  setHandler(ledgerCutWritten, (c) => {
    if (c.checkpointId === id) cut = c;
  });
  let earlyCut: LedgerCutWritten | undefined;
  setHandler(earlyLedgerCutWritten, (c) => {
    if (c.checkpointId === id) earlyCut = c;
  });
  const stage = async (name: string): Promise<void> => {
    setCurrentDetails(`**${input.trigger} checkpoint** \`${id}\` of run \`${input.run}\`\n\nstage: **${name}**`);
    await upsertMemo({ stage: name });
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
    await upsertMemo({ outcome: outcome.outcome, reason: outcome.reason, stage: 'done' });
    setCurrentDetails(`**${input.trigger} checkpoint** \`${id}\`: **${outcome.outcome}** (${outcome.reason})`);
    return outcome;
  };

  let location: SnapshotLocation | undefined;
  let prepared = false;
  let commit: GymCommitOutcome | undefined;
  let scope: EpisodeId[] = [];
  let restarts: string[] = [];
  try {
    // Allocation and the restart check side by side: admission is already closed. A participant
    // that restarted fresh holds none of the episodes the controller has in flight: a snapshot now
    // would publish a cut that continues nothing. Recover first.
    await stage('allocate');
    const [allocated, now] = await Promise.all([
      files.allocateSnapshot({ checkpointDir: input.checkpointDir, anchor: input.anchor }),
      discovery.discoverGym({ runDir: input.gymRunDir, requireModel: input.requireModel }).catch((err: unknown) => {
        const down = unreachableServers(err);
        if (down.length > 0) throw new AttemptFailed('io_error', `Gym unreachable: ${down.join(', ')}`, true);
        throw err;
      }),
    ]);
    location = allocated;
    const restarted = Object.entries(input.topology.instances ?? {}).filter(([name, id]) => now.instances[name] !== id).map(([name]) => name);
    if (restarted.length > 0) {
      throw new GymRestarted(`Gym processes restarted since discovery: ${restarted.sort().join(', ')}`);
    }

    await stage('prepare');
    // From the first prepare call on, Gym may hold admission closed under this ID: the fan-out goes
    // stage by stage, so a prepare that fails on one server has prepared the ones before it. Every
    // exit aborts or releases it (a resume where prepare never arrived only fences the ID).
    prepared = true;
    const prep = await timed('prepare', () =>
      gymCall(() =>
        control.gymPrepare.executeWithOptions({ summary: `prepare ${id}` }, [
          { topology: input.topology, checkpointId: id, timeoutS: input.prepareTimeoutS },
        ]),
      ),
    );
    if (!prep.prepared) {
      throw new AttemptFailed('timeout', `Gym not ready by the prepare deadline; blockers: ${JSON.stringify(prep.blockers).slice(0, 500)}`);
    }
    restarts = prep.restarts;
    const restartSet = new Set(prep.restarts);
    scope = input.inFlight.filter((e) => !restartSet.has(captureKey(e)));
    // Gym is frozen: the run writes its ledger cut while Gym commits (usually the final one).
    // Not awaited: an awaited signal costs a workflow task of its own while admission is closed.
    // Best effort like the early cut itself: without it the run cuts after the commit.
    void getExternalWorkflowHandle(input.runWorkflowId)
      .signal(checkpointPrepared, { checkpointId: id, tmpDir: location.tmpDir })
      .catch(() => undefined);

    await stage('commit');
    commit = await timed('commit', () =>
      gymCall(() =>
        control.gymCommit.executeWithOptions({ summary: `commit ${id} (${scope.length} episodes)` }, [
          { topology: input.topology, checkpointId: id, timeoutS: input.prepareTimeoutS, checkpointDir: location!.tmpDir, scope },
        ]),
      ),
    );
    checkCommitInvariants(input, commit);

    await stage('ledger cut');
    // In flight at the start, neither committed nor a restart: scope episodes no environment committed.
    const unsettled = commit.uncommitted;
    // Nothing unsettled (the usual case): the early cut stands whatever the run would answer, so
    // the attempt publishes with it and says so (`takesEarlyCut`); the run then sends no
    // confirmation, which would reach this workflow as it completes and cost another task.
    const early = unsettled.length === 0;
    let untold: unknown;
    // Waiting for the cut, not for the signal's delivery; a signal that fails ends the wait.
    void getExternalWorkflowHandle(input.runWorkflowId)
      .signal(checkpointCommitted, { checkpointId: id, tmpDir: location.tmpDir, unsettled, ...(early ? { takesEarlyCut: true } : {}) })
      .catch((err: unknown) => (untold = err ?? new Error('signal failed')));
    const usable = (): LedgerCutWritten | undefined => cut ?? (early ? earlyCut : undefined);
    const gotCut = await timed('ledger_cut', () => condition(() => usable() !== undefined || untold !== undefined, `${Math.max(30, input.prepareTimeoutS)} seconds`));
    cut = usable();
    if (untold !== undefined && cut === undefined) throw untold;
    if (!gotCut || !cut) throw new AttemptFailed('timeout', 'the run did not write its ledger cut in time');

    await stage('publish');
    const manifest: SnapshotManifestSlim = {
      schema_version: 1,
      format: 'rollout-checkpoint/ts',
      run: input.run,
      checkpoint_id: id,
      sequence: location.sequence,
      base_train_step: cut.baseTrainStep,
      trainer_version: cut.trainerVersion,
      dataloader_cursor: cut.dataloaderCursor,
      gym_topology_fingerprint: input.topology.fingerprint,
      // Each participant's episode list is completed from the commit file when it finalizes.
      gym_checkpoint: { scope: scope.map(captureKey), restarts, participants: commit.participants },
      ledger_sha256: cut.sha256,
      ledger_bytes: cut.bytes,
      created_at: new Date().toISOString(),
    };
    await timed('publish', () => files.finalizeSnapshot({ location: location!, manifest, fingerprint: input.topology.fingerprint }));
  } catch (err) {
    // Nothing was published: drop the temp snapshot, abort Gym with the same ID.
    const reason = err instanceof AttemptFailed ? err.reason : classify(err);
    const message = describeFailure(err);
    const gymRestarted = err instanceof GymRestarted;
    const gymUnreachable = err instanceof AttemptFailed && err.gymUnreachable;
    if (location) await storage.discardSnapshot({ tmpDir: location.tmpDir }).catch(() => undefined);
    let abortPending = false;
    if (prepared) {
      await stage('abort');
      abortPending = !(await resumeGym(control, input, seconds));
    }
    return finish({
      outcome: 'failed',
      reason,
      error: message,
      abortPending,
      gymRestarted,
      ...(gymUnreachable ? { gymUnreachable } : {}),
      scope: scope.map(captureKey),
      restarts,
    });
  }

  // Published: the snapshot is durable and authoritative from here on. Retention (older
  // snapshots) is the run's, once it has the outcome and admission is open again.
  await stage('resume');
  const released = await resumeGym(control, input, seconds);
  return finish({
    outcome: released ? 'completed' : 'failed',
    reason: released ? 'completed' : 'release_pending',
    releasePending: !released,
    snapshotDir: location.finalDir,
    sequence: location.sequence,
    scope: scope.map(captureKey),
    restarts,
  });
}

/** Resume (release or abort) with the same ID; false when it failed (pending, retried later). */
async function resumeGym(control: ReturnType<typeof controlActivities>, input: CheckpointAttemptInput, seconds: CheckpointStageSeconds): Promise<boolean> {
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

/**
 * Wraps exactly the Gym prepare and commit calls (review AI, controller.md §2.8): their failures
 * are retryable for the pump — a timeout keeps `timeout`, everything else is `io_error`.
 */
async function gymCall<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const type = failureType(err);
    const message = describeFailure(err);
    if (type === 'invariant_error') throw err;
    const reason = type === 'gym_not_ready' || /timeout|deadline/i.test(type ?? '') ? 'timeout' : 'io_error';
    throw new AttemptFailed(reason, message, unreachableServers(err).length > 0);
  }
}

/** The controller's own checks: never wrapped, an inconsistency ends the run. */
function checkCommitInvariants(input: CheckpointAttemptInput, commit: GymCommitOutcome): void {
  if (commit.checkpointId !== input.checkpointId) {
    throw ApplicationFailure.nonRetryable(`commit answered for ${commit.checkpointId}, not ${input.checkpointId}`, 'invariant_error');
  }
  const expected = input.topology.members.map((m) => m.name).sort();
  const got = Object.keys(commit.participants).sort();
  if (JSON.stringify(expected) !== JSON.stringify(got)) {
    throw ApplicationFailure.nonRetryable(`committed participants ${got.join(',')} differ from the topology ${expected.join(',')}`, 'invariant_error');
  }
  for (const name of got) {
    const member = input.topology.members.find((m) => m.name === name)!;
    if (commit.participants[name]!.kind !== member.kind) {
      throw ApplicationFailure.nonRetryable(`participant ${name} committed as ${commit.participants[name]!.kind}, discovered as ${member.kind}`, 'invariant_error');
    }
  }
}



function classify(err: unknown): CheckpointReason {
  const type = failureType(err);
  return type === 'invariant_error' ? 'invariant_error' : 'io_error';
}

export function checkpointWorkflowId(run: string, checkpointId: string): string {
  return `${run}/checkpoint/${checkpointId}`;
}
