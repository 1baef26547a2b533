// The training run (workflow ID = run name). It owns the ledger, the two admission gates, the
// rollout deadlines, dispatch, the checkpoint pump and training-step consumption; its event history
// is the controller's durable memory. Rollout and checkpoint attempts are child workflows.
import {
  ApplicationFailure,
  ParentClosePolicy,
  allHandlersFinished,
  condition,
  continueAsNew,
  getExternalWorkflowHandle,
  log,
  setCurrentDetails,
  setHandler,
  startChild,
  upsertMemo,
  uuid4,
  workflowInfo,
} from '@temporalio/workflow';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import type { CheckpointOutcome, CheckpointTrigger, GymTopology, RolloutReport } from '../protocol/controller.js';
import { captureKey, type CaptureKey, type EpisodeId } from '../protocol/ids.js';
import type { RunConfig } from '../protocol/run-config.js';
import { controlActivities, storageActivities } from './activities-proxy.js';
import { checkpointAttempt, checkpointWorkflowId } from './checkpointAttempt.js';
import * as D from './deadlines.js';
import * as L from './ledger.js';
import {
  checkpointCommitted,
  checkpointNow,
  deadlineExpired,
  ledgerCutWritten,
  pauseRun,
  resumeRun,
  rolloutFinished,
  runStatus,
  stopRun,
  type CheckpointCommitted,
  type RunStatus,
} from './messages.js';
import { rolloutAttempt, rolloutWorkflowId } from './rolloutAttempt.js';

export interface InFlight {
  episode: EpisodeId;
  groupId: string;
  environment: string;
  workflowId: string;
  deadlineSignalled: boolean;
}

export interface RunState {
  ledger: L.Ledger;
  topology: GymTopology | null;
  deadlines: D.DeadlineRegistry;
  inFlight: Record<CaptureKey, InFlight>;
  /** true = closed. Neither owner reopens the other's gate (controller.md §1.1). */
  gates: { weightSync: boolean; gymCheckpoint: boolean };
  pendingRelease: { checkpointId: string; snapshotDir: string; trigger: CheckpointTrigger } | null;
  pendingAbort: { checkpointId: string; trigger: CheckpointTrigger } | null;
  lastSnapshot: string | null;
  consecutiveFailures: number;
  checkpoints: CheckpointOutcome[];
  steps: number;
  trainerVersion: number;
  rewardPerStep: number[];
  completedRollouts: number;
  failedRollouts: number;
  /** Reports received and not yet applied (carried across continue-as-new). */
  reports: RolloutReport[];
  /** Rollouts finished for good, to `forget` in Gym. */
  forgetQueue: string[];
  lastCheckpointAtMs: number | null;
  checkpointSeq: number;
  continuedAsNew: number;
  paused: boolean;
  stopRequested: boolean;
}

export interface TrainingRunInput {
  config: RunConfig;
  state?: RunState;
}

export interface RunSummary {
  run: string;
  steps: number;
  rewardPerStep: number[];
  completedRollouts: number;
  failedRollouts: number;
  checkpoints: CheckpointOutcome[];
  lastSnapshot: string | null;
  continuedAsNew: number;
}

const GYM_HOLDER = 'gym-checkpoint';
const MAX_KEPT_OUTCOMES = 50;
const FORGET_BATCH = 64;

export function initialState(config: RunConfig): RunState {
  return {
    ledger: L.emptyLedger(config.run.name),
    topology: null,
    deadlines: D.emptyDeadlines(),
    inFlight: {},
    gates: { weightSync: false, gymCheckpoint: false },
    pendingRelease: null,
    pendingAbort: null,
    lastSnapshot: null,
    consecutiveFailures: 0,
    checkpoints: [],
    steps: 0,
    trainerVersion: 0,
    rewardPerStep: [],
    completedRollouts: 0,
    failedRollouts: 0,
    reports: [],
    forgetQueue: [],
    lastCheckpointAtMs: null,
    checkpointSeq: 0,
    continuedAsNew: 0,
    paused: false,
    stopRequested: false,
  };
}

export async function trainingRun(input: TrainingRunInput): Promise<RunSummary> {
  const cfg = input.config;
  const st = input.state ?? initialState(cfg);
  const runId = workflowInfo().workflowId;
  const control = controlActivities(cfg.run.task_queue);
  const storage = storageActivities(cfg.run.task_queue);
  const totalGroups = cfg.grpo.max_num_steps * cfg.grpo.num_prompts_per_step;
  const intervalMs = cfg.rollout_checkpointing.snapshot_attempt_interval_s === null ? null : cfg.rollout_checkpointing.snapshot_attempt_interval_s * 1000;

  let changed = false;
  const wake = (): void => {
    changed = true;
  };
  let cutRequest: CheckpointCommitted | undefined;
  let checkpointRunning = false;
  let manualRequested = 0;
  let manualServed = 0;
  const manualOutcomes: Record<number, CheckpointOutcome> = {};
  let fatal: ApplicationFailure | undefined;

  setHandler(rolloutFinished, (r) => {
    st.reports.push(r);
    wake();
  });
  setHandler(checkpointCommitted, (c) => {
    cutRequest = c;
    wake();
  });
  setHandler(pauseRun, () => {
    st.paused = true;
    wake();
  });
  setHandler(resumeRun, () => {
    st.paused = false;
    wake();
  });
  setHandler(stopRun, () => {
    st.stopRequested = true;
    wake();
  });
  setHandler(runStatus, (): RunStatus => status());
  setHandler(checkpointNow, async () => {
    const ticket = ++manualRequested;
    wake();
    await condition(() => manualOutcomes[ticket] !== undefined);
    const o = manualOutcomes[ticket]!;
    delete manualOutcomes[ticket];
    return o;
  });

  function status(): RunStatus {
    return {
      run: cfg.run.name,
      phase: phase(),
      steps: st.steps,
      cursor: st.ledger.cursor,
      inFlight: Object.keys(st.inFlight).length,
      completedRollouts: st.completedRollouts,
      failedRollouts: st.failedRollouts,
      gates: { ...st.gates },
      pendingRelease: st.pendingRelease?.checkpointId ?? null,
      pendingAbort: st.pendingAbort?.checkpointId ?? null,
      lastSnapshot: st.lastSnapshot,
      consecutiveFailures: st.consecutiveFailures,
      checkpoints: st.checkpoints,
      rewardPerStep: st.rewardPerStep,
      continuedAsNew: st.continuedAsNew,
    };
  }

  function phase(): string {
    if (st.stopRequested) return 'stopping';
    if (checkpointRunning) return 'checkpointing';
    if (st.pendingRelease) return 'release_pending';
    if (st.pendingAbort) return 'abort_pending';
    if (st.paused) return 'paused';
    return 'dispatching';
  }

  const admissionOpen = (): boolean => !st.gates.weightSync && !st.gates.gymCheckpoint && !st.paused && !st.stopRequested;

  // --- results -----------------------------------------------------------------------------

  function applyReports(): void {
    const reports = st.reports;
    st.reports = [];
    for (const r of reports) {
      const key = captureKey(r.episode);
      const flight = st.inFlight[key];
      delete st.inFlight[key];
      D.removeDeadline(st.deadlines, key);
      if (r.status === 'completed' && r.reward !== null) {
        const sealed = L.sealAttempt(st.ledger, r.episode, r.reward, false);
        if (sealed === 'sealed') st.completedRollouts += 1;
        continue;
      }
      // A failed, timed-out or retired attempt (already retired by its workflow): start the
      // sibling (or its whole group) over as the next attempt, within the attempt budget.
      void flight;
      const found = L.findSibling(st.ledger, r.episode.rollout_id);
      if (!found || L.currentAttempt(found.sibling).gym_attempt !== r.episode.attempt) continue;
      st.failedRollouts += 1;
      const attemptsSoFar = found.sibling.attempts.length;
      if (attemptsSoFar >= cfg.async_rl.max_attempts_per_sibling || r.terminal) {
        // Give up on this sibling: a masked zero-reward placeholder keeps its group trainable.
        L.sealAttempt(st.ledger, r.episode, 0, true);
        log.warn('sibling gave up', { key, reason: r.reason });
      } else {
        L.failAttempt(st.ledger, r.episode, r.reason ?? r.status);
      }
    }
  }

  // --- training steps ------------------------------------------------------------------------

  function consumeReadyGroups(): void {
    // A snapshot is bound to one trainer step: no step advances while a checkpoint is in progress.
    if (checkpointRunning) return;
    for (;;) {
      const ready = L.readyGroups(st.ledger);
      if (ready.length < cfg.grpo.num_prompts_per_step || st.steps >= cfg.grpo.max_num_steps) return;
      const batch = ready.slice(0, cfg.grpo.num_prompts_per_step);
      let sum = 0;
      let n = 0;
      for (const g of batch) {
        for (const s of g.siblings) {
          const a = L.currentAttempt(s);
          if (!a.mask_sample) {
            sum += a.reward ?? 0;
            n += 1;
          }
        }
        L.consumeGroup(st.ledger, g.group_id);
        st.forgetQueue.push(...L.rolloutIds(g));
      }
      st.steps += 1;
      st.rewardPerStep.push(n ? sum / n : 0);
      log.info('training step', { step: st.steps, reward: st.rewardPerStep[st.rewardPerStep.length - 1] });
    }
  }

  // --- dispatch ------------------------------------------------------------------------------

  async function dispatch(): Promise<void> {
    if (!admissionOpen() || !st.topology) return;
    // Keep `max_in_flight_groups` unfinished groups reserved.
    const unfinished = L.unfinishedGroupCount(st.ledger);
    const want = Math.min(cfg.async_rl.max_in_flight_groups - unfinished, totalGroups - st.ledger.cursor);
    if (want > 0) {
      const loaded = await storage.loadPromptGroups({
        seed: cfg.run.seed,
        cursor: st.ledger.cursor,
        groups: want,
        groupSize: cfg.grpo.num_generations_per_prompt,
        tasksets: cfg.grpo.tasksets,
      });
      for (const g of loaded.groups) {
        const environment = cfg.grpo.environments[g.taskset] ?? `${g.taskset}_env`;
        L.reserveGroup(st.ledger, {
          group_id: `${cfg.run.name}.${g.group_id}`,
          prompt_id: g.prompt_id,
          task_source: g.taskset,
          environment,
          recovery_granularity: g.taskset === 'genrm' ? 'prompt_group' : 'sibling',
          restore_level: 'turn',
          target_step: Math.floor(st.ledger.cursor / cfg.grpo.num_prompts_per_step),
          tasks: g.tasks,
        });
        st.ledger.cursor += 1;
      }
    }
    if (!admissionOpen()) return;
    const todo = L.reservedAttempts(st.ledger);
    const topology = st.topology;
    await Promise.all(
      todo.map(async ({ group, sibling, attempt }) => {
        const episode = L.episodeOfAttempt(sibling, attempt);
        const key = captureKey(episode);
        const env = topology.servers[group.environment];
        if (!env) throw ApplicationFailure.nonRetryable(`no environment server '${group.environment}' in the Gym deployment`, 'invariant_error');
        L.markDispatched(group, sibling, group.environment);
        const workflowId = rolloutWorkflowId(cfg.run.name, episode);
        st.inFlight[key] = { episode, groupId: group.group_id, environment: group.environment, workflowId, deadlineSignalled: false };
        if (cfg.async_rl.rollout_timeout_s !== null) D.addDeadline(st.deadlines, key, cfg.async_rl.rollout_timeout_s * 1000, Date.now());
        try {
          await startChild(rolloutAttempt, {
            workflowId,
            taskQueue: cfg.run.task_queue,
            parentClosePolicy: ParentClosePolicy.ABANDON,
            staticSummary: `rollout ${key} (${group.task_source}) of run ${cfg.run.name}`,
            staticDetails: `group \`${group.group_id}\`, sibling ${sibling.generation_index}, Gym attempt ${attempt.gym_attempt}${attempt.continued ? ' (continued from a saved turn)' : ''}`,
            args: [
              {
                run: cfg.run.name,
                runWorkflowId: runId,
                episode,
                environment: group.environment,
                environmentUrl: env.url,
                task: group.tasks[sibling.generation_index],
                topology,
                controlTaskQueue: cfg.run.task_queue,
                runTaskQueue: cfg.run.rollout_task_queue,
                retireTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
              },
            ],
          });
        } catch (err) {
          // Already running (a start recorded before a continue-as-new): it will report by signal.
          if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
        }
      }),
    );
  }

  // --- deadlines -----------------------------------------------------------------------------

  async function signalExpired(): Promise<void> {
    const now = Date.now();
    for (const key of D.expired(st.deadlines, now)) {
      const flight = st.inFlight[key];
      D.removeDeadline(st.deadlines, key);
      if (!flight || flight.deadlineSignalled) continue;
      flight.deadlineSignalled = true;
      await getExternalWorkflowHandle(flight.workflowId).signal(deadlineExpired).catch(() => undefined);
    }
  }

  // --- forget ----------------------------------------------------------------------------------

  async function forgetFinished(force: boolean): Promise<void> {
    if (!st.topology || st.forgetQueue.length === 0 || checkpointRunning || st.gates.gymCheckpoint) return;
    if (!force && st.forgetQueue.length < FORGET_BATCH) return;
    const batch = st.forgetQueue.slice(0, 1000);
    try {
      await control.gymForget.executeWithOptions({ summary: `forget ${batch.length} rollouts` }, [
        { topology: st.topology, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s, rolloutIds: batch },
      ]);
      st.forgetQueue = st.forgetQueue.slice(batch.length);
    } catch (err) {
      // Kept for the next pass (e.g. a checkpoint opened meanwhile, or retire_incomplete).
      log.warn('forget failed; will retry', { error: String(err) });
    }
  }

  // --- checkpoints -----------------------------------------------------------------------------

  function mintCheckpointId(): string {
    st.checkpointSeq += 1;
    return `rollout-step-${st.steps}-snapshot-${st.checkpointSeq}-${uuid4().replace(/-/g, '')}`;
  }

  function closeGymGate(): void {
    st.gates.gymCheckpoint = true;
    D.hold(st.deadlines, GYM_HOLDER, Date.now());
  }

  function openGymGate(): void {
    st.gates.gymCheckpoint = false;
    D.release(st.deadlines, GYM_HOLDER, Date.now());
  }

  async function record(o: CheckpointOutcome): Promise<void> {
    st.checkpoints = [...st.checkpoints, o].slice(-MAX_KEPT_OUTCOMES);
    if (o.outcome === 'failed') st.consecutiveFailures += 1;
    else st.consecutiveFailures = 0;
    if (o.outcome === 'completed' && o.snapshotDir) st.lastSnapshot = o.snapshotDir;
    st.lastCheckpointAtMs = Date.now();
    await storage.appendCheckpointMetrics({ checkpointDir: cfg.run.checkpoint_dir, outcome: o }).catch(() => undefined);
    await upsertMemo({ lastCheckpoint: `${o.outcome}/${o.reason}`, lastSnapshot: st.lastSnapshot });
    if (o.reason === 'invariant_error') {
      fatal = ApplicationFailure.nonRetryable(`checkpoint ${o.checkpointId} hit a controller invariant: ${o.error ?? ''}`, 'invariant_error');
    } else if (st.consecutiveFailures >= cfg.rollout_checkpointing.max_consecutive_failures) {
      fatal = ApplicationFailure.nonRetryable(
        `${st.consecutiveFailures} consecutive checkpoint failures (last: ${o.reason}); Gym does not recover`,
        'max_consecutive_failures',
      );
    }
  }

  /** Retries a pending release or abort with the same ID; true when nothing is pending any more. */
  async function retryPending(trigger: CheckpointTrigger): Promise<CheckpointOutcome | undefined> {
    const pending = st.pendingRelease ?? st.pendingAbort;
    if (!pending || !st.topology) return undefined;
    const released = st.pendingRelease !== null;
    const t = Date.now();
    try {
      await control.gymResume.executeWithOptions({ summary: `${released ? 'release' : 'abort'} ${pending.checkpointId} (retry)` }, [
        { topology: st.topology, checkpointId: pending.checkpointId, timeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s },
      ]);
    } catch (err) {
      return {
        checkpointId: pending.checkpointId,
        trigger,
        outcome: 'failed',
        reason: released ? 'release_pending' : 'io_error',
        releasePending: released,
        abortPending: !released,
        error: String(err),
        seconds: { resume: (Date.now() - t) / 1000 },
        at: new Date().toISOString(),
      };
    }
    const snapshotDir = st.pendingRelease?.snapshotDir;
    st.pendingRelease = null;
    st.pendingAbort = null;
    openGymGate();
    // A released pending snapshot is a completed checkpoint; an abort only reopens the gate.
    return released
      ? { checkpointId: pending.checkpointId, trigger, outcome: 'completed', reason: 'completed', snapshotDir, seconds: { resume: (Date.now() - t) / 1000 }, at: new Date().toISOString() }
      : undefined;
  }

  async function runCheckpoint(trigger: CheckpointTrigger): Promise<CheckpointOutcome> {
    if (!st.topology) throw ApplicationFailure.nonRetryable('no Gym topology', 'invariant_error');
    if (st.pendingRelease || st.pendingAbort) {
      const wasRelease = st.pendingRelease !== null;
      const retried = await retryPending(trigger);
      if (retried) return retried;
      if (wasRelease) throw new Error('unreachable: a released pending snapshot returns its outcome');
      // The abort went through: continue with a new attempt.
    }
    const checkpointId = mintCheckpointId();
    const closedAt = Date.now();
    closeGymGate();
    setCurrentDetails(`**run** \`${cfg.run.name}\`: checkpoint \`${checkpointId}\` (${trigger}) in progress`);
    const inFlight = Object.values(st.inFlight).map((f) => f.episode);
    const handle = await startChild(checkpointAttempt, {
      workflowId: checkpointWorkflowId(cfg.run.name, checkpointId),
      taskQueue: cfg.run.task_queue,
      parentClosePolicy: ParentClosePolicy.ABANDON,
      staticSummary: `${trigger} checkpoint ${checkpointId} of run ${cfg.run.name}`,
      staticDetails: `${inFlight.length} rollouts in flight at step ${st.steps}`,
      args: [
        {
          run: cfg.run.name,
          runWorkflowId: runId,
          checkpointId,
          trigger,
          topology: st.topology,
          inFlight,
          checkpointDir: cfg.run.checkpoint_dir,
          anchor: st.steps === 0 ? 'bootstrap' : `step_${st.steps}`,
          keepLatestK: cfg.rollout_checkpointing.keep_latest_k,
          prepareTimeoutS: cfg.rollout_checkpointing.gym.prepare_timeout_s,
          controlTaskQueue: cfg.run.task_queue,
        },
      ],
    });
    let outcome: CheckpointOutcome | undefined;
    const result = handle.result().then((o) => (outcome = o));
    await condition(() => outcome !== undefined || cutRequest?.checkpointId === checkpointId);
    if (outcome === undefined && cutRequest?.checkpointId === checkpointId) {
      const req = cutRequest;
      cutRequest = undefined;
      // Episodes neither continued nor restarts finished before the cut: their /run replies are
      // on the wire. Wait briefly so the cut holds their results (an attempt that never reached
      // Gym simply reruns from its input after a cold restore).
      const settled = new Set([...req.environmentKeys, ...req.restarts]);
      await condition(
        () => Object.keys(st.inFlight).every((k) => settled.has(k)) && st.reports.length === 0,
        cfg.controller.late_result_wait_ms,
      );
      applyReports();
      const cut = await storage.writeLedgerCut({ tmpDir: req.tmpDir, ledger: st.ledger });
      await handle.signal(ledgerCutWritten, {
        checkpointId,
        sha256: cut.sha256,
        bytes: cut.bytes,
        dataloaderCursor: st.ledger.cursor,
        baseTrainStep: st.steps,
        trainerVersion: st.trainerVersion,
      });
    }
    await result;
    const o = outcome!;
    o.seconds.admission_closed_seconds = (Date.now() - closedAt) / 1000;
    if (o.releasePending && o.snapshotDir) {
      st.pendingRelease = { checkpointId, snapshotDir: o.snapshotDir, trigger };
      st.lastSnapshot = o.snapshotDir; // published and durable even though Gym is still paused
    } else if (o.abortPending) {
      st.pendingAbort = { checkpointId, trigger };
    } else {
      openGymGate();
    }
    return o;
  }

  function checkpointDue(): boolean {
    if (checkpointRunning || !st.topology) return false;
    if (manualRequested > manualServed) return true;
    if (st.pendingRelease || st.pendingAbort) {
      // Retry a pending release/abort soon: admission stays closed until it goes through.
      return Date.now() - (st.lastCheckpointAtMs ?? 0) >= Math.min(intervalMs ?? 5_000, 5_000);
    }
    if (intervalMs === null) return false;
    return Date.now() - (st.lastCheckpointAtMs ?? workflowStartMs) >= intervalMs;
  }

  function startCheckpoint(): void {
    const manual = manualRequested > manualServed;
    const ticket = manual ? ++manualServed : 0;
    checkpointRunning = true;
    void (async () => {
      try {
        const o = await runCheckpoint(manual ? 'manual' : 'periodic');
        await record(o);
        if (ticket) manualOutcomes[ticket] = o;
      } catch (err) {
        fatal = err instanceof ApplicationFailure ? err : ApplicationFailure.nonRetryable(String(err), 'invariant_error');
      } finally {
        checkpointRunning = false;
        wake();
      }
    })();
  }

  const workflowStartMs = Date.now();

  // --- main loop ---------------------------------------------------------------------------------

  if (!st.topology) {
    st.topology = await control.discoverGym({ runDir: cfg.run.gym_run_dir, requireModel: cfg.rollout_checkpointing.gym.require_model_participant });
  }
  await upsertMemo({ run: cfg.run.name, steps: st.steps });
  const done = (): boolean => (st.steps >= cfg.grpo.max_num_steps || st.stopRequested) && Object.keys(st.inFlight).length === 0 && !checkpointRunning;

  for (;;) {
    if (fatal) throw fatal;
    changed = false;
    applyReports();
    consumeReadyGroups();
    if (done() && !st.pendingRelease && !st.pendingAbort && manualRequested === manualServed) break;
    if (checkpointDue()) startCheckpoint();
    await signalExpired();
    if (st.steps < cfg.grpo.max_num_steps) await dispatch();
    await forgetFinished(false);
    setCurrentDetails(
      `**run** \`${cfg.run.name}\` — ${phase()}\n\nstep ${st.steps}/${cfg.grpo.max_num_steps}, ${Object.keys(st.inFlight).length} rollouts in flight, ` +
        `${st.completedRollouts} completed, last snapshot: ${st.lastSnapshot ?? 'none'}`,
    );
    const info = workflowInfo();
    if (!checkpointRunning && (info.historyLength > cfg.controller.max_history_events || info.continueAsNewSuggested)) {
      await condition(allHandlersFinished);
      if (!checkpointRunning && manualRequested === manualServed) {
        st.continuedAsNew += 1;
        await continueAsNew<typeof trainingRun>({ config: cfg, state: st });
      }
    }
    const timeouts = [D.nextExpiryMs(st.deadlines, Date.now()), nextCheckpointMs()].filter((x): x is number => x !== undefined);
    const wait = timeouts.length ? Math.max(1, Math.min(...timeouts)) : undefined;
    if (!changed) {
      if (wait === undefined) await condition(() => changed || fatal !== undefined);
      else await condition(() => changed || fatal !== undefined, wait);
    }
  }

  await forgetFinished(true);
  await condition(allHandlersFinished);
  return {
    run: cfg.run.name,
    steps: st.steps,
    rewardPerStep: st.rewardPerStep,
    completedRollouts: st.completedRollouts,
    failedRollouts: st.failedRollouts,
    checkpoints: st.checkpoints,
    lastSnapshot: st.lastSnapshot,
    continuedAsNew: st.continuedAsNew,
  };

  function nextCheckpointMs(): number | undefined {
    if (checkpointRunning) return undefined;
    if (st.pendingRelease || st.pendingAbort) return 5_000;
    if (intervalMs === null) return undefined;
    return Math.max(0, intervalMs - (Date.now() - (st.lastCheckpointAtMs ?? workflowStartMs)));
  }
}
