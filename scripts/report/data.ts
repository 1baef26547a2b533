// The run report's data (scripts/report.ts): the run's Temporal histories (the run's executions
// and its rollout shards'), its result or status, and its `checkpoint_metrics.jsonl` → one plain
// ReportData, rounded for display. Pure: fetch.ts does the I/O, html.ts draws the page. Events are
// taken in either form Temporal gives them: the SDK's decoded protobufs (fetchHistory) or their
// JSON (`temporal workflow show -o json`, the golden histories of test/workflows/histories).
import type { StartRolloutAttemptsInput } from '../../activities/attempt-starts.js';
import { CHECKPOINT_STAGE_NAMES, type CheckpointOutcome, type CheckpointStage, outcomeKey, type RolloutReport } from '../../protocol/controller.js';
import type { RunConfig } from '../../protocol/run-config.js';
import type { RunStatus, ShardAnswer, ShardRequest } from '../../workflows/messages.js';
import type { RecoveryRecord, RunState, RunSummary, TrainingRunInput } from '../../workflows/run/state.js';

// --- what goes in ------------------------------------------------------------------------------

type Bytes = Uint8Array | string;
interface PayloadLike {
  metadata?: Record<string, Bytes> | null;
  data?: Bytes | null;
}
interface PayloadsLike {
  payloads?: PayloadLike[] | null;
}
type Named = { name?: string | null } | null;

/** The fields of a history event the report reads (protobuf objects and their JSON both fit). */
export interface HistoryEventLike {
  eventTime?: string | { seconds?: number | string | { toNumber(): number } | null; nanos?: number | null } | null;
  workflowExecutionStartedEventAttributes?: { input?: PayloadsLike | null; continuedExecutionRunId?: string | null } | null;
  workflowExecutionCompletedEventAttributes?: { result?: PayloadsLike | null } | null;
  workflowExecutionFailedEventAttributes?: { failure?: FailureLike | null } | null;
  workflowExecutionTerminatedEventAttributes?: { reason?: string | null } | null;
  workflowExecutionCanceledEventAttributes?: object | null;
  workflowExecutionTimedOutEventAttributes?: object | null;
  workflowExecutionContinuedAsNewEventAttributes?: { input?: PayloadsLike | null } | null;
  startChildWorkflowExecutionInitiatedEventAttributes?: { workflowId?: string | null; workflowType?: Named } | null;
  activityTaskScheduledEventAttributes?: { activityType?: Named; input?: PayloadsLike | null } | null;
  workflowExecutionSignaledEventAttributes?: { signalName?: string | null; input?: PayloadsLike | null } | null;
  signalExternalWorkflowExecutionInitiatedEventAttributes?: { signalName?: string | null; input?: PayloadsLike | null } | null;
}
interface FailureLike {
  message?: string | null;
  cause?: FailureLike | null;
}

/** A workflow's executions (a continue-as-new chain), oldest first, each its events in order. */
export interface WorkflowChain {
  workflowId: string;
  executions: HistoryEventLike[][];
}

export interface ReportInput {
  run: WorkflowChain;
  /** The run's rollout shards (its `rolloutShard` children: shardIdsOf). */
  shards: WorkflowChain[];
  /** The `status` query's answer, for a run without a result (running, failed); null: none answered. */
  status?: RunStatus | null;
  /** `checkpoint_metrics.jsonl`: its path, and its text (null: there is no such file). */
  metrics?: { file: string; text: string | null } | null;
  /** Notes of the fetch (what could not be had), shown on the page. */
  notes?: string[];
  generatedAt: string;
}

// --- what comes out ----------------------------------------------------------------------------

/** How the run's newest execution stands. */
export type RunEnd = 'running' | 'completed' | 'failed' | 'terminated' | 'canceled' | 'timed_out';

/** Stages of a checkpoint attempt, in the order they start. */
export const STAGES = CHECKPOINT_STAGE_NAMES;
export type Stage = CheckpointStage;

export interface CheckpointRow {
  checkpointId: string;
  sequence: number | null;
  trigger: string;
  outcome: string;
  reason: string;
  at: string;
  /** Seconds since the run started (null: no start time). */
  t: number | null;
  admissionClosed: number | null;
  total: number | null;
  gymParticipant: number | null;
  stages: Partial<Record<Stage, number>>;
  scopeCount: number | null;
  restartCount: number | null;
  error: string | null;
  /** Where the row came from: the metrics file, or (missing there) the run's own record. */
  source: 'metrics' | 'run';
}

export interface RecoveryRow {
  /** When it began (its record's time: null when the record is gone, past the last 50). */
  startedAt: string | null;
  tStart: number | null;
  /** When the shards were asked to settle it (its end). */
  at: string | null;
  t: number | null;
  cold: boolean;
  restoreFailed: boolean;
  continued: number;
  restarted: number;
  /** The shards that answered (of those asked). */
  shardsAnswered: number;
  shardsAsked: number;
  error: string | null;
}

/** A cumulative count at `t` seconds since the run started. */
export interface Point {
  t: number;
  n: number;
}

export interface ReportData {
  run: string;
  state: RunEnd;
  /** Why it failed or was ended, for those states. */
  failure: string | null;
  startedAt: string | null;
  closedAt: string | null;
  generatedAt: string;
  /** Where steps and rewards came from. */
  source: 'result' | 'status query' | 'history';
  /** What a run that took over a checkpoint directory started from (its rewards begin after `step`). */
  restoredFrom: { anchor: string | null; step: number; snapshotDir: string | null } | null;
  config: {
    checkpointDir: string | null;
    tasksets: string[];
    maxSteps: number | null;
    promptsPerStep: number | null;
    generationsPerPrompt: number | null;
    targetLevel: string | null;
  };
  totals: {
    steps: number;
    trainerVersion: number | null;
    completedRollouts: number;
    failedRollouts: number;
    dispatched: number;
    shards: number;
    executions: number;
    checkpoints: Record<'completed' | 'failed' | 'skipped', number>;
    recoveries: number;
    continued: number;
    restarted: number;
  };
  rewardPerStep: Array<{ step: number; reward: number }>;
  checkpoints: CheckpointRow[];
  recoveries: RecoveryRow[];
  timeline: { dispatched: Point[]; completed: Point[]; inFlight: Point[] };
  metrics: { file: string | null; found: boolean; lines: number; duplicates: number; unreadable: number; otherRuns: number };
  notes: string[];
}

// --- reading events ----------------------------------------------------------------------------

const utf8 = new TextDecoder();

function bytes(b: Bytes): Uint8Array {
  // Protobuf JSON writes bytes as base64.
  return typeof b === 'string' ? Buffer.from(b, 'base64') : b;
}

/** A payload's value: JSON payloads decoded, null payloads undefined, anything else (binary, encrypted) undefined. */
export function decodePayload(p: PayloadLike | null | undefined): unknown {
  const enc = p?.metadata?.encoding;
  if (!enc) return undefined;
  const encoding = utf8.decode(bytes(enc));
  if (encoding !== 'json/plain' || p?.data === undefined || p.data === null) return undefined;
  try {
    return JSON.parse(utf8.decode(bytes(p.data)));
  } catch {
    return undefined;
  }
}

const first = (ps: PayloadsLike | null | undefined): unknown => decodePayload(ps?.payloads?.[0]);

/** An event's time in epoch ms (NaN when it has none). */
export function eventMs(e: HistoryEventLike): number {
  const t = e.eventTime;
  if (!t) return Number.NaN;
  if (typeof t === 'string') return Date.parse(t);
  const s = t.seconds;
  const seconds = typeof s === 'object' && s !== null ? s.toNumber() : Number(s ?? 0);
  return seconds * 1000 + Math.floor((t.nanos ?? 0) / 1e6);
}

const iso = (ms: number): string | null => (Number.isFinite(ms) ? new Date(ms).toISOString() : null);

/** Rounded to `digits` decimals (display precision: ms for seconds). */
export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
const roundOrNull = (x: unknown, digits = 3): number | null => (typeof x === 'number' && Number.isFinite(x) ? round(x, digits) : null);

/** The workflow IDs of the children of `type` a chain started, in order, each once. */
export function childIdsOf(chain: WorkflowChain, type: string): string[] {
  const out = new Set<string>();
  for (const events of chain.executions) {
    for (const e of events) {
      const a = e.startChildWorkflowExecutionInitiatedEventAttributes;
      if (a?.workflowType?.name === type && a.workflowId) out.add(a.workflowId);
    }
  }
  return [...out];
}

/** The run's rollout shards, which fetch.ts fetches next. */
export function shardIdsOf(run: WorkflowChain): string[] {
  return childIdsOf(run, 'rolloutShard');
}

/** The input of the run's newest execution that has one (its config, and the state it carried). */
function latestInput(run: WorkflowChain): TrainingRunInput | undefined {
  for (let i = run.executions.length - 1; i >= 0; i--) {
    const input = first(run.executions[i]![0]?.workflowExecutionStartedEventAttributes?.input) as TrainingRunInput | undefined;
    if (input?.config) return input;
  }
  return undefined;
}

/** The run's config (from its newest execution's input: continue-as-new carries it on). */
export function runConfigOf(run: WorkflowChain): RunConfig | undefined {
  return latestInput(run)?.config;
}

function failureText(f: FailureLike | null | undefined): string | null {
  const parts: string[] = [];
  for (let c = f; c && parts.length < 5; c = c.cause) if (c.message) parts.push(c.message);
  return parts.length ? parts.join(': caused by ') : null;
}

/** How the newest execution ended (or not), its result, and when. */
function endOf(run: WorkflowChain): { state: RunEnd; failure: string | null; result?: RunSummary; closedMs: number } {
  const events = run.executions[run.executions.length - 1] ?? [];
  const last = events[events.length - 1];
  const none = { failure: null, closedMs: Number.NaN };
  if (!last) return { state: 'running', ...none };
  const ms = eventMs(last);
  if (last.workflowExecutionCompletedEventAttributes) {
    return { state: 'completed', failure: null, result: first(last.workflowExecutionCompletedEventAttributes.result) as RunSummary, closedMs: ms };
  }
  if (last.workflowExecutionFailedEventAttributes)
    return { state: 'failed', failure: failureText(last.workflowExecutionFailedEventAttributes.failure), closedMs: ms };
  if (last.workflowExecutionTerminatedEventAttributes) {
    return { state: 'terminated', failure: last.workflowExecutionTerminatedEventAttributes.reason || null, closedMs: ms };
  }
  if (last.workflowExecutionCanceledEventAttributes) return { state: 'canceled', failure: null, closedMs: ms };
  if (last.workflowExecutionTimedOutEventAttributes) return { state: 'timed_out', failure: null, closedMs: ms };
  return { state: 'running', ...none };
}

// --- checkpoint_metrics.jsonl ------------------------------------------------------------------

/**
 * The file's outcomes, each checkpoint once: a retried append can write a line twice (the first
 * is kept), and a crash mid-write can leave a line torn (skipped and counted).
 */
export function parseCheckpointMetrics(text: string): { outcomes: CheckpointOutcome[]; lines: number; duplicates: number; unreadable: number } {
  const seen = new Set<string>();
  const outcomes: CheckpointOutcome[] = [];
  let lines = 0;
  let duplicates = 0;
  let unreadable = 0;
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    lines++;
    let o: CheckpointOutcome;
    try {
      o = JSON.parse(line) as CheckpointOutcome;
    } catch {
      unreadable++;
      continue;
    }
    if (typeof o?.checkpointId !== 'string' || typeof o.seconds !== 'object' || o.seconds === null) {
      unreadable++;
      continue;
    }
    if (seen.has(outcomeKey(o))) {
      duplicates++;
      continue;
    }
    seen.add(outcomeKey(o));
    outcomes.push(o);
  }
  return { outcomes, lines, duplicates, unreadable };
}

function checkpointRow(o: CheckpointOutcome, t0: number, source: CheckpointRow['source']): CheckpointRow {
  const s = o.seconds ?? {};
  const stages: Partial<Record<Stage, number>> = {};
  for (const k of STAGES) {
    const v = roundOrNull(s[k]);
    if (v !== null) stages[k] = v;
  }
  const at = Date.parse(o.at);
  return {
    checkpointId: o.checkpointId,
    sequence: typeof o.sequence === 'number' ? o.sequence : null,
    trigger: o.trigger,
    outcome: o.outcome,
    reason: o.reason,
    at: o.at,
    t: Number.isFinite(at) && Number.isFinite(t0) ? round((at - t0) / 1000) : null,
    admissionClosed: roundOrNull(s.admission_closed_seconds),
    total: roundOrNull(s.total),
    gymParticipant: roundOrNull(s.gym_participant_seconds),
    stages,
    scopeCount: typeof o.scopeCount === 'number' ? o.scopeCount : null,
    restartCount: typeof o.restartCount === 'number' ? o.restartCount : null,
    error: o.error ?? null,
    source,
  };
}

// --- recoveries --------------------------------------------------------------------------------

/**
 * Every recovery the run settled, from its history: the `settleRecovery` requests it sent its
 * shards (one request ID per shard, `<run>/req-<seq>/<shard>`; a signal sent again repeats it) and
 * their answers. Unlike the result's records (the last 50), this covers every one, and a run
 * still going too. `records` (the result's or the carried state's) add when each began and the
 * restore errors.
 */
function recoveriesOf(run: WorkflowChain, t0: number, records: RecoveryRecord[]): RecoveryRow[] {
  const asks = new Map<string, { ms: number; cold: boolean; restoreFailed: boolean; ids: Set<string> }>();
  const answers = new Map<string, ShardAnswer>();
  for (const events of run.executions) {
    for (const e of events) {
      const out = e.signalExternalWorkflowExecutionInitiatedEventAttributes;
      if (out?.signalName === 'shardRequest') {
        const req = first(out.input) as ShardRequest | undefined;
        if (req?.kind !== 'settleRecovery' || typeof req.id !== 'string') continue;
        const key = req.id.replace(/\/\d+$/, '');
        const ask = asks.get(key) ?? { ms: eventMs(e), cold: req.cold, restoreFailed: req.restoreFailed, ids: new Set<string>() };
        ask.ids.add(req.id);
        asks.set(key, ask);
      }
      const inn = e.workflowExecutionSignaledEventAttributes;
      if (inn?.signalName === 'shardAnswer') {
        const a = first(inn.input) as ShardAnswer | undefined;
        if (a && typeof a.id === 'string' && !answers.has(a.id)) answers.set(a.id, a);
      }
    }
  }
  const rows: RecoveryRow[] = [...asks.values()].map((ask) => {
    const got = [...ask.ids].map((id) => answers.get(id)).filter((a): a is ShardAnswer => a !== undefined);
    return {
      startedAt: null,
      tStart: null,
      at: iso(ask.ms),
      t: Number.isFinite(ask.ms) && Number.isFinite(t0) ? round((ask.ms - t0) / 1000) : null,
      cold: ask.cold,
      restoreFailed: ask.restoreFailed,
      continued: got.reduce((n, a) => n + (a.continued ?? 0), 0),
      restarted: got.reduce((n, a) => n + (a.restarted ?? 0), 0),
      shardsAnswered: got.length,
      shardsAsked: ask.ids.size,
      error: null,
    };
  });
  // A record starts with its recovery (`at`) and is settled after it: each to the first settle at or after it.
  let next = 0;
  for (const rec of records) {
    const at = Date.parse(rec.at);
    while (next < rows.length && rows[next]!.at !== null && Date.parse(rows[next]!.at!) < at) next++;
    if (next >= rows.length) break;
    const row = rows[next++]!;
    row.startedAt = rec.at;
    row.tStart = Number.isFinite(at) && Number.isFinite(t0) ? round((at - t0) / 1000) : null;
    if (rec.error) row.error = rec.error;
  }
  return rows;
}

// --- dispatch and completion over time ---------------------------------------------------------

/** At most this many points a series: a long run's thousands of rollouts still draw at once. */
export const MAX_POINTS = 600;

/** Cumulative counts of `times` (epoch ms), in seconds since t0; thinned to MAX_POINTS, keeping the last. */
export function cumulative(times: number[], t0: number): Point[] {
  const sorted = times.filter(Number.isFinite).sort((a, b) => a - b);
  const all: Point[] = [{ t: 0, n: 0 }];
  sorted.forEach((ms, i) => {
    const t = round((ms - t0) / 1000);
    // Events of the same millisecond are one point.
    if (all[all.length - 1]!.t === t) all[all.length - 1]!.n = i + 1;
    else all.push({ t, n: i + 1 });
  });
  return thin(all);
}

function thin(points: Point[]): Point[] {
  if (points.length <= MAX_POINTS) return points;
  const step = points.length / (MAX_POINTS - 1);
  const out: Point[] = [];
  for (let i = 0; i < MAX_POINTS - 1; i++) out.push(points[Math.floor(i * step)]!);
  out.push(points[points.length - 1]!);
  return out;
}

/** The difference of two cumulative event lists at every event of either: rollouts in flight. */
function inFlightOf(starts: number[], ends: number[], t0: number): Point[] {
  const events = [...starts.filter(Number.isFinite).map((ms) => [ms, 1] as const), ...ends.filter(Number.isFinite).map((ms) => [ms, -1] as const)];
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const all: Point[] = [{ t: 0, n: 0 }];
  let n = 0;
  for (const [ms, d] of events) {
    n = Math.max(0, n + d);
    const t = round((ms - t0) / 1000);
    if (all[all.length - 1]!.t === t) all[all.length - 1]!.n = n;
    else all.push({ t, n });
  }
  return thin(all);
}

/**
 * From the shards' histories: a rollout attempt dispatched is one in a `startRolloutAttempts` batch;
 * one completed is a `rolloutFinished` or `rolloutsFinished` report with status completed (the shard's view, the one
 * that counts for training). Each capture key once.
 */
function timelineOf(shards: WorkflowChain[], t0: number): ReportData['timeline'] & { dispatchedCount: number } {
  const started = new Map<string, number>();
  const reported = new Map<string, { ms: number; completed: boolean }>();
  for (const shard of shards) {
    for (const events of shard.executions) {
      for (const e of events) {
        const starts = e.activityTaskScheduledEventAttributes;
        if (starts?.activityType?.name === 'startRolloutAttempts') {
          const batch = first(starts.input) as StartRolloutAttemptsInput | undefined;
          for (const a of batch?.starts ?? []) if (!started.has(a.workflowId)) started.set(a.workflowId, eventMs(e));
        }
        const sig = e.workflowExecutionSignaledEventAttributes;
        // One report from an attempt, or several from the `/run`s of one worker (completed ones).
        const reports =
          sig?.signalName === 'rolloutFinished'
            ? [first(sig.input) as RolloutReport | undefined]
            : sig?.signalName === 'rolloutsFinished'
              ? ((first(sig.input) as RolloutReport[] | undefined) ?? [])
              : [];
        for (const r of reports) {
          if (r?.captureKey && !reported.has(r.captureKey)) reported.set(r.captureKey, { ms: eventMs(e), completed: r.status === 'completed' });
        }
      }
    }
  }
  const ends = [...reported.values()];
  return {
    dispatched: cumulative([...started.values()], t0),
    completed: cumulative(
      ends.filter((r) => r.completed).map((r) => r.ms),
      t0,
    ),
    inFlight: inFlightOf(
      [...started.values()],
      ends.map((r) => r.ms),
      t0,
    ),
    dispatchedCount: started.size,
  };
}

// --- the whole report --------------------------------------------------------------------------

export function buildReportData(input: ReportInput): ReportData {
  const { run } = input;
  const notes = [...(input.notes ?? [])];
  const t0 = eventMs(run.executions[0]?.[0] ?? {});
  const end = endOf(run);
  const carried = latestInput(run);
  const cfg = carried?.config;
  const state: Partial<RunState> = carried?.state ?? {};

  // Steps and rewards: the result, else the status query, else the state carried by the newest continue-as-new.
  let source: ReportData['source'];
  let steps: number;
  let rewards: number[];
  let outcomes: CheckpointOutcome[];
  let completedRollouts: number;
  let failedRollouts: number;
  let trainerVersion: number | null;
  let records: RecoveryRecord[];
  if (end.result) {
    const r = end.result;
    source = 'result';
    ({ steps, rewardPerStep: rewards, checkpoints: outcomes, completedRollouts, failedRollouts, trainerVersion, recoveries: records } = r);
  } else if (input.status) {
    const s = input.status;
    source = 'status query';
    ({ steps, rewardPerStep: rewards, checkpoints: outcomes, completedRollouts, failedRollouts } = s);
    trainerVersion = null;
    records = state.recoveries ?? [];
  } else {
    source = 'history';
    steps = state.steps ?? 0;
    rewards = state.rewardPerStep ?? [];
    outcomes = state.checkpoints ?? [];
    completedRollouts = state.completedRollouts ?? 0;
    failedRollouts = state.failedRollouts ?? 0;
    trainerVersion = state.trainerVersion ?? null;
    records = state.recoveries ?? [];
    notes.push('no result and no status answer: steps, rewards and counts are as of the run’s newest continue-as-new');
  }
  // A run that took over a checkpoint directory starts after that step: its rewards are the steps after it.
  const firstStep = steps - rewards.length + 1;
  const rewardPerStep = rewards.map((reward, i) => ({ step: firstStep + i, reward: round(reward, 4) }));
  const from = end.result?.restoredFrom ?? state.restoredFrom ?? null;

  // Checkpoints: the metrics file (every one, de-duplicated), this run's lines only (a taken-over
  // directory holds the previous run's too), then any the run recorded that the file lacks (its
  // append is best effort).
  const children = new Set(childIdsOf(run, 'checkpointAttempt').map((id) => id.slice(id.lastIndexOf('/') + 1)));
  const own = new Set(outcomes.map((o) => o.checkpointId));
  const inSpan = (o: CheckpointOutcome): boolean => {
    const at = Date.parse(o.at);
    return Number.isFinite(at) && Number.isFinite(t0) && at >= t0 && !(at > end.closedMs);
  };
  const metrics: ReportData['metrics'] = { file: input.metrics?.file ?? null, found: false, lines: 0, duplicates: 0, unreadable: 0, otherRuns: 0 };
  const rows: CheckpointRow[] = [];
  if (input.metrics?.text != null) {
    const parsed = parseCheckpointMetrics(input.metrics.text);
    Object.assign(metrics, { found: true, lines: parsed.lines, duplicates: parsed.duplicates, unreadable: parsed.unreadable });
    for (const o of parsed.outcomes) {
      if (children.has(o.checkpointId) || own.has(o.checkpointId) || inSpan(o)) rows.push(checkpointRow(o, t0, 'metrics'));
      else metrics.otherRuns++;
    }
    if (parsed.duplicates) notes.push(`${parsed.duplicates} repeated line(s) of checkpoint_metrics.jsonl dropped (a retried append)`);
    if (parsed.unreadable) notes.push(`${parsed.unreadable} unreadable line(s) of checkpoint_metrics.jsonl skipped`);
    if (metrics.otherRuns)
      notes.push(`${metrics.otherRuns} line(s) of checkpoint_metrics.jsonl are another run’s (a taken-over checkpoint directory): left out`);
  } else if (input.metrics) {
    notes.push(`no ${input.metrics.file}: checkpoints are the run’s own record (its last ${outcomes.length})`);
  }
  const inFile = new Set(rows.map(outcomeKey));
  for (const o of outcomes) if (!inFile.has(outcomeKey(o))) rows.push(checkpointRow(o, t0, 'run'));
  rows.sort((a, b) => Date.parse(a.at) - Date.parse(b.at));

  const recoveries = recoveriesOf(run, t0, records);
  const timeline = timelineOf(input.shards, t0);
  const count = (k: string): number => rows.filter((r) => r.outcome === k).length;
  const { dispatchedCount, ...series } = timeline;

  return {
    run: cfg?.run.name ?? run.workflowId,
    state: end.state,
    failure: end.failure,
    startedAt: iso(t0),
    closedAt: iso(end.closedMs),
    generatedAt: input.generatedAt,
    source,
    restoredFrom: from ? { anchor: from.anchor, step: from.step, snapshotDir: from.snapshotDir } : null,
    config: {
      checkpointDir: cfg?.run.checkpoint_dir ?? null,
      tasksets: cfg?.grpo.tasksets ?? [],
      maxSteps: cfg?.grpo.max_num_steps ?? null,
      promptsPerStep: cfg?.grpo.num_prompts_per_step ?? null,
      generationsPerPrompt: cfg?.grpo.num_generations_per_prompt ?? null,
      targetLevel: cfg?.rollout_recovery.target_level ?? null,
    },
    totals: {
      steps,
      trainerVersion,
      completedRollouts,
      failedRollouts,
      dispatched: dispatchedCount,
      shards: input.shards.length,
      executions: run.executions.length,
      checkpoints: { completed: count('completed'), failed: count('failed'), skipped: count('skipped') },
      recoveries: recoveries.length,
      continued: recoveries.reduce((n, r) => n + r.continued, 0),
      restarted: recoveries.reduce((n, r) => n + r.restarted, 0),
    },
    rewardPerStep,
    checkpoints: rows,
    recoveries,
    timeline: series,
    metrics,
    notes,
  };
}
