// The checkpoint pump: when a checkpoint is due (periodic, trainer boundary, manual, or a pending
// release/abort to retry), its attempt started as a child workflow with admission closed in every
// shard, its outcome recorded, and "Gym does not recover" decided from the failures of a Gym that
// is up.
import { ApplicationFailure, ParentClosePolicy, executeChild, log, setCurrentDetails, sleep, upsertMemo, uuid4 } from '@temporalio/workflow';
import type { CheckpointOutcome, CheckpointTrigger } from '../../protocol/controller.js';
import { checkpointAttempt, checkpointWorkflowId } from '../checkpointAttempt.js';
import { outcomeOfFailure } from '../checkpoint-outcome.js';
import { unreachableServers } from '../failures.js';
import { HOLDERS, releasedHolds } from '../messages.js';
import { checkpointRecorded } from '../metrics.js';
import { CHECKPOINT_OUTCOME, CHECKPOINT_TRIGGER, RUN_NAME, TRAINER_STEP } from '../search-attributes.js';
import type { RunContext } from './context.js';
import { ensureShards, holdsForCheckpoint, syncHolds } from './shards.js';
import { MAX_KEPT_OUTCOMES } from './state.js';

/** A pending release or abort is retried this often: admission stays closed until it goes through. */
export const PENDING_RETRY_MS = 5_000;

async function openGymGate(ctx: RunContext): Promise<void> {
  ctx.st.gates.gymCheckpoint = false;
  await syncHolds(ctx);
}

/** The attempt released the shards itself once Gym resumed: the run takes the same holds over, then syncs any change since. */
async function gateReleasedByAttempt(ctx: RunContext): Promise<void> {
  ctx.st.holds = releasedHolds(ctx.st.holds, HOLDERS.checkpoint);
  await openGymGate(ctx);
}

export function checkpointDue(ctx: RunContext): boolean {
  const { st } = ctx;
  if (ctx.checkpointRunning || !st.topology) return false;
  if (ctx.manualRequested > ctx.manualServed || ctx.boundaryRequested) return true;
  return ctx.checkpointTimerFired;
}

/**
 * (Re)arms the timer after which the next periodic checkpoint, or a pending release/abort's retry,
 * is due. Due when the timer fires, not when the clock says so: the SDK may run workflow code with
 * an older task's clock (a fresh worker answering a query), and a decision on the clock then
 * differs on replay (docs/controller.md). Only the duration comes from the clock.
 */
export function armCheckpointTimer(ctx: RunContext): void {
  const { st } = ctx;
  const pending = st.pendingRelease !== null || st.pendingAbort !== null;
  const period = pending ? Math.min(ctx.intervalMs ?? PENDING_RETRY_MS, PENDING_RETRY_MS) : ctx.intervalMs;
  ctx.checkpointTimerFired = false;
  const seq = ++ctx.checkpointTimerSeq;
  if (period === null) return;
  const left = Math.max(1, period - (Date.now() - (st.lastCheckpointAtMs ?? ctx.startedAtMs)));
  void sleep(left).then(() => {
    // A timer armed before the last checkpoint ended is stale.
    if (seq !== ctx.checkpointTimerSeq) return;
    ctx.checkpointTimerFired = true;
    ctx.wake();
  });
}

/** Starts the due checkpoint beside the main loop; its outcome is recorded (and answered, if manual). */
export function startCheckpoint(ctx: RunContext): void {
  const { st } = ctx;
  const manual = ctx.manualRequested > ctx.manualServed;
  const ticket = manual ? ++ctx.manualServed : 0;
  const trigger: CheckpointTrigger = manual ? 'manual' : ctx.boundaryRequested ? 'trainer_boundary' : 'periodic';
  // Only the timer of a pending release or abort fired: retry it, and start no new attempt (the
  // periodic one, if set, is due on its own timer, armed again below).
  const pending = st.pendingRelease ?? st.pendingAbort;
  const retryOnly = !manual && !ctx.boundaryRequested && pending !== null;
  ctx.boundaryRequested = false;
  ctx.checkpointRunning = true;
  void (async () => {
    try {
      const o = retryOnly ? await retryPending(ctx, pending.trigger) : await runCheckpoint(ctx, trigger);
      if (o === undefined) {
        // The abort went through: nothing to record.
      } else if (o.outcome === 'skipped' && o.reason === 'missing_trainer_anchor') {
        // Logged once per step, not every tick; not a failure and not an attempt.
        if (st.missingAnchorStep !== st.steps) {
          st.missingAnchorStep = st.steps;
          log.info('periodic checkpoint skipped: no trainer anchor for this step yet', { step: st.steps });
        }
        st.lastCheckpointAtMs = Date.now();
      } else {
        await record(ctx, o);
      }
      if (ticket && o) ctx.manualOutcomes[ticket] = o;
    } catch (err) {
      ctx.fatal = err instanceof ApplicationFailure ? err : ApplicationFailure.nonRetryable(String(err), 'invariant_error');
    } finally {
      ctx.checkpointRunning = false;
      armCheckpointTimer(ctx);
      ctx.wake();
    }
  })();
}

export async function record(ctx: RunContext, full: CheckpointOutcome): Promise<void> {
  const { st, cfg } = ctx;
  // Kept (status, summary, metrics file, continue-as-new state) with counts, not the key lists:
  // 50 outcomes of 8,000 keys each would outgrow every payload they travel in.
  const { scope, restarts, ...o }: CheckpointOutcome = full;
  if (scope) o.scopeCount = scope.length;
  if (restarts) o.restartCount = restarts.length;
  st.checkpoints = [...st.checkpoints, o].slice(-MAX_KEPT_OUTCOMES);
  checkpointRecorded(o);
  // Failures of a Gym that is up count towards "Gym does not recover"; an attempt that only found
  // Gym down or restarted does not: the recovery it leads to waits for Gym (bounded) and decides.
  if (o.outcome !== 'failed') st.consecutiveFailures = 0;
  else if (!o.gymRestarted && !o.gymUnreachable) st.consecutiveFailures += 1;
  if (o.outcome === 'completed' && o.snapshotDir) st.lastSnapshot = o.snapshotDir;
  st.lastCheckpointAtMs = Date.now();
  await ctx.storage.appendCheckpointMetrics({ checkpointDir: cfg.run.checkpoint_dir, outcome: o }).catch(() => undefined);
  await upsertMemo({ lastCheckpoint: `${o.outcome}/${o.reason}`, lastSnapshot: st.lastSnapshot });
  if (o.reason === 'invariant_error') {
    ctx.fatal = ApplicationFailure.nonRetryable(`checkpoint ${o.checkpointId} hit a controller invariant: ${o.error ?? ''}`, 'invariant_error');
  } else if (st.consecutiveFailures >= cfg.rollout_checkpointing.max_consecutive_failures) {
    ctx.fatal = ApplicationFailure.nonRetryable(
      `${st.consecutiveFailures} consecutive checkpoint failures (last: ${o.reason}); Gym does not recover`,
      'max_consecutive_failures',
    );
  }
}

/** Retries a pending release or abort with the same ID: its outcome (a release), or undefined (nothing pending, or an abort that went through). */
export async function retryPending(ctx: RunContext, trigger: CheckpointTrigger): Promise<CheckpointOutcome | undefined> {
  const { st, cfg } = ctx;
  const pending = st.pendingRelease ?? st.pendingAbort;
  if (!pending || !st.topology) return undefined;
  const released = st.pendingRelease !== null;
  const t = Date.now();
  const at = (): { seconds: { resume: number }; at: string } => ({ seconds: { resume: (Date.now() - t) / 1000 }, at: new Date().toISOString() });
  try {
    await ctx.control.gymResume.executeWithOptions({ summary: `${released ? 'release' : 'abort'} ${pending.checkpointId} (retry)` }, [
      { topology: st.topology, checkpointId: pending.checkpointId, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s },
    ]);
  } catch (err) {
    const unreachable = unreachableServers(err).length > 0;
    if (unreachable) st.recoveryNeeded = true;
    return {
      checkpointId: pending.checkpointId,
      trigger,
      outcome: 'failed',
      reason: released ? 'release_pending' : 'io_error',
      releasePending: released,
      abortPending: !released,
      ...(unreachable ? { gymUnreachable: true } : {}),
      error: String(err),
      ...at(),
    };
  }
  const snapshotDir = st.pendingRelease?.snapshotDir;
  st.pendingRelease = null;
  st.pendingAbort = null;
  await openGymGate(ctx);
  // A released pending snapshot is a completed checkpoint; an abort only reopens the gate.
  return released ? { checkpointId: pending.checkpointId, trigger, outcome: 'completed', reason: 'completed', snapshotDir, ...at() } : undefined;
}

async function runCheckpoint(ctx: RunContext, trigger: CheckpointTrigger): Promise<CheckpointOutcome> {
  const { st, cfg } = ctx;
  if (!st.topology) throw ApplicationFailure.nonRetryable('no Gym topology', 'invariant_error');
  if (st.pendingRelease || st.pendingAbort) {
    const wasRelease = st.pendingRelease !== null;
    const retried = await retryPending(ctx, trigger);
    if (retried) return retried;
    if (wasRelease) throw new Error('unreachable: a released pending snapshot returns its outcome');
    // The abort went through: continue with a new attempt.
  }
  if (ctx.ownsWeights && cfg.checkpointing.enabled && st.lastAnchorStep !== st.steps) {
    // A snapshot binds to a durable trainer anchor of the current step (controller.md §2.1).
    return { checkpointId: '', trigger, outcome: 'skipped', reason: 'missing_trainer_anchor', seconds: {}, at: new Date().toISOString() };
  }
  st.checkpointSeq += 1;
  const checkpointId = `rollout-step-${st.steps}-snapshot-${st.checkpointSeq}-${uuid4().replace(/-/g, '')}`;
  const closedAt = Date.now();
  // Admission closed everywhere at once: the run's gate now, each shard's with the attempt's
  // candidates request, which carries these holds (one signal per shard, not two).
  st.gates.gymCheckpoint = true;
  await ensureShards(ctx);
  holdsForCheckpoint(ctx);
  setCurrentDetails(`**run** \`${cfg.run.name}\`: checkpoint \`${checkpointId}\` (${trigger}) in progress`);
  const o = await executeChild(checkpointAttempt, {
    workflowId: checkpointWorkflowId(cfg.run.name, checkpointId),
    taskQueue: cfg.run.task_queue,
    parentClosePolicy: ParentClosePolicy.ABANDON,
    staticSummary: `${trigger} checkpoint ${checkpointId} of run ${cfg.run.name}`,
    staticDetails: `at step ${st.steps}, ${st.shards} rollout shards`,
    typedSearchAttributes: [
      { key: RUN_NAME, value: cfg.run.name },
      { key: TRAINER_STEP, value: st.steps },
      { key: CHECKPOINT_TRIGGER, value: trigger },
      { key: CHECKPOINT_OUTCOME, value: 'running' },
    ],
    args: [
      {
        run: cfg.run.name,
        checkpointId,
        trigger,
        topology: st.topology,
        shards: st.shards,
        holds: st.holds,
        cut: { dataloaderCursor: st.cursor, baseTrainStep: st.steps, trainerVersion: st.trainerVersion },
        lateResultWaitMs: cfg.controller.late_result_wait_ms,
        checkpointDir: cfg.run.checkpoint_dir,
        anchor: st.steps === 0 ? 'bootstrap' : `step_${st.steps}`,
        prepareTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
        controlTaskQueue: cfg.run.task_queue,
        scheduleToStartTimeoutS: cfg.controller.schedule_to_start_timeout_s,
        gymRunDir: cfg.run.gym_run_dir,
        requireModel: cfg.rollout_checkpointing.gym.require_model_participant,
      },
    ],
  }).catch((err: unknown) => {
    // A failed attempt fails its workflow and carries its outcome in the failure.
    const failed = outcomeOfFailure(err);
    if (!failed) throw err;
    return failed;
  });
  if (o.releasePending && o.snapshotDir) {
    st.pendingRelease = { checkpointId, snapshotDir: o.snapshotDir, trigger };
    st.lastSnapshot = o.snapshotDir; // published and durable even though Gym is still paused
  } else if (o.abortPending) {
    st.pendingAbort = { checkpointId, trigger };
  } else {
    await gateReleasedByAttempt(ctx);
  }
  // Until the attempt reopened the shards (or until now, when admission stays closed).
  o.seconds.admission_closed_seconds = ((o.releasedAtMs ?? Date.now()) - closedAt) / 1000;
  // Published: older snapshots go now, with admission open (best effort: the next one retries;
  // the run awaits it before it continues as new or ends).
  if (o.snapshotDir) {
    const applied = ctx.storage
      .applyRetention({ checkpointDir: cfg.run.checkpoint_dir, keepLatestK: cfg.rollout_checkpointing.keep_latest_k })
      .catch(() => undefined);
    ctx.retention = Promise.all([ctx.retention, applied]);
  }
  if (o.gymRestarted || o.gymUnreachable) st.recoveryNeeded = true;
  return o;
}
