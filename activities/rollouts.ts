// One physical rollout attempt: POST `/run` to the environment server and map its reply to a
// RolloutReport. `/run` lasts minutes to hours, so it gets its own undici pool without the 300 s
// header/body timeouts; heartbeats carry cancellation to the call, which aborts the request.
import type { Client } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import { Agent, type Dispatcher, request } from 'undici';
import { FAILURE_TYPES, type RolloutReport, type RunEpisodeInput, type TaskRef } from '../protocol/controller.js';
import { errorCodeOf } from '../protocol/errors.js';
import { captureKey } from '../protocol/ids.js';
import { CLIENT_KEEP_ALIVE } from '../protocol/keep-alive.js';
import { INSTANCE_HEADER, RunReplySchema, type RunFailure, type RunResult, type Task, type Taskset } from '../protocol/tasks.js';
import { groupIdOf, siblingTask, taskAt } from './dataset.js';
import { activityContext, clip, errorMessage, heartbeating, invariantFailure } from './activity-context.js';
import type { RunKeeper } from './run-keeper.js';
import { joinUrl } from './control-client.js';
import { traceHeaders } from '../servers/common/tracing.js';
import { reportBatchesOf } from './report-batches.js';
import type { SealedOutcome } from '../workflows/ledger.js';
import { sealedAttempt } from '../workflows/messages.js';

/** Wait before retrying a `/run` refused with `admission_closed` (a checkpoint is open). */
export const ADMISSION_CLOSED_RETRY_DELAY = '2s';
/** Summary fields kept from a result (besides reward). */
const MAX_SUMMARY_FIELDS = 24;
const MAX_SUMMARY_STRING = 200;
const MAX_REASON = 1_000;

/** The `/run` pool: not the control pool (data calls parked by a checkpoint must not starve control calls). */
export function createRunPool(): Agent {
  return new Agent({ headersTimeout: 0, bodyTimeout: 0, ...CLIENT_KEEP_ALIVE });
}

/** Reward plus the small scalar fields of a result; never the trajectory. */
export function summarizeResult(result: RunResult): Record<string, unknown> {
  const out: Record<string, unknown> = { reward: result.reward };
  let n = 0;
  for (const [k, v] of Object.entries(result)) {
    if (k === 'reward' || n >= MAX_SUMMARY_FIELDS) continue;
    const small =
      v === null || typeof v === 'boolean' || (typeof v === 'number' && Number.isFinite(v)) || (typeof v === 'string' && v.length <= MAX_SUMMARY_STRING);
    if (small) {
      out[k] = v;
      n++;
    }
  }
  return out;
}

function failureSummary(f: RunFailure): Record<string, unknown> {
  return {
    ...(f.stage !== undefined ? { stage: f.stage } : {}),
    ...(f.failure_kind !== undefined ? { failure_kind: f.failure_kind } : {}),
  };
}

function transient(message: string, details: Record<string, unknown>, nextRetryDelay?: string): ApplicationFailure {
  return ApplicationFailure.create({
    message: clip(message, 2_000),
    type: FAILURE_TYPES.transient,
    nonRetryable: false,
    details: [details],
    ...(nextRetryDelay !== undefined ? { nextRetryDelay } : {}),
  });
}

/** Maps one `/run` HTTP reply to a report, or throws the typed failure. */
export function reportOfReply(input: RunEpisodeInput, status: number, body: unknown, seconds: number): RolloutReport {
  const key = captureKey(input.episode);
  const base = { captureKey: key, episode: { rollout_id: input.episode.rollout_id, attempt: input.episode.attempt }, seconds };
  if (status === 200) {
    const parsed = RunReplySchema.safeParse(body);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      const reason = `invalid /run reply at ${issue.path.join('.') || '(body)'}: ${issue.message}`;
      return { ...base, status: 'failed', reward: null, terminal: true, reason: clip(reason, MAX_REASON), result: null };
    }
    const reply = parsed.data;
    if (captureKey(reply.episode_id) !== key) {
      const reason = `/run reply names episode ${captureKey(reply.episode_id)}, expected ${key}`;
      return { ...base, status: 'failed', reward: null, terminal: true, reason, result: null };
    }
    if (reply.result) {
      return { ...base, status: 'completed', reward: reply.result.reward, terminal: false, result: summarizeResult(reply.result) };
    }
    const f = reply.failure!;
    return {
      ...base,
      status: 'failed',
      reward: null,
      terminal: f.terminal,
      reason: clip(f.failure_reason, MAX_REASON),
      result: failureSummary(f),
    };
  }
  const code = errorCodeOf(body);
  const detail =
    code !== undefined ? String((body as { error: { detail?: unknown } }).error.detail ?? '') : typeof body === 'string' ? body : JSON.stringify(body);
  const message = `/run of ${key} on ${input.environment}: HTTP ${status}${code ? ` ${code}` : ''} ${clip(detail)}`.trim();
  const details = { captureKey: key, environment: input.environment, status, ...(code ? { code } : {}), detail: clip(detail) };
  if (status >= 500) throw transient(message, details);
  if (status === 409 && code === 'admission_closed') throw transient(message, details, ADMISSION_CLOSED_RETRY_DELAY);
  // stale_attempt (the attempt was retired) and every other refusal: the same request gets the same answer.
  throw ApplicationFailure.nonRetryable(clip(message, 2_000), code ?? `http_${status}`, details);
}

/**
 * `keeper`: the worker's keeper of `/run`s (run-keeper.ts): it runs each call, heartbeats it and
 * sends its outcome, paced; without it the SDK heartbeats and completes each activity.
 */
export function createRolloutActivities(runPool: Dispatcher, keeper?: RunKeeper) {
  return {
    async runEpisode(input: RunEpisodeInput): Promise<RolloutReport> {
      const start = Date.now();
      if (!input?.episode || typeof input.environmentUrl !== 'string') throw invariantFailure('runEpisode needs an episode and an environmentUrl');
      const key = captureKey(input.episode);
      const task = input.task ?? (input.taskRef ? taskFromRef(input.taskRef) : undefined);
      // Bytes of their own: undici would copy a string into a slice of Node's shared 8 KB buffer
      // pool, and a `/run` parked for minutes keeps its body, so each held the whole 8 KB slab
      // (a heap snapshot of 2,000 parked `/run`s: 2,005 of them; docs/performance.md).
      const body = new TextEncoder().encode(JSON.stringify({ episode_id: { rollout_id: input.episode.rollout_id, attempt: input.episode.attempt }, task }));
      const url = joinUrl(input.environmentUrl, '/run');
      const post = async (signal: AbortSignal | undefined): Promise<{ status: number; body: unknown }> => {
        try {
          const res = await request(url, {
            method: 'POST',
            dispatcher: runPool,
            headers: {
              'content-type': 'application/json',
              ...(input.expectedInstance ? { [INSTANCE_HEADER]: input.expectedInstance } : {}),
              ...traceHeaders(),
            },
            body,
            ...(signal ? { signal } : {}),
          });
          const text = await res.body.text();
          let parsed: unknown = text;
          if (text.length > 0) {
            try {
              parsed = JSON.parse(text);
            } catch {
              parsed = text;
            }
          }
          return { status: res.statusCode, body: parsed };
        } catch (err) {
          if (signal?.aborted) throw err; // cancelled (heartbeating rethrows the cancellation)
          // Transport error: `/run` is idempotent per attempt, so a retry attaches to the running
          // attempt or receives its kept reply.
          throw transient(`/run of ${key} on ${input.environment}: transport error: ${errorMessage(err)}`, {
            captureKey: key,
            environment: input.environment,
            code: (err as { code?: unknown }).code ?? null,
          });
        }
      };
      // A reply that arrived is reported even if cancellation raced it: the attempt is over either way.
      const report = (reply: { status: number; body: unknown }): RolloutReport => reportOfReply(input, reply.status, reply.body, (Date.now() - start) / 1000);
      // A completed rollout's report goes to its shard from here (`reportTo`), so its attempt
      // workflow ends in the task that receives it, without a task to signal and one more to see the
      // signal through: a third of the attempt's workflow tasks.
      const reportTo = input.reportTo;
      const deliver = reportTo ? (client: Client, r: unknown) => deliverReport(client, reportTo, r as RolloutReport) : undefined;
      // An earlier try of this activity ended the episode and its report reached the shard, but the
      // server never took its completion: that report is the attempt's outcome (Gym may have
      // crashed since, and with it the reply it kept).
      const kept = keeper?.takeKept(key) as RolloutReport | undefined;
      if (kept) return kept;
      const sealed = reportTo ? await sealedReport(reportTo, input, start) : undefined;
      if (sealed) return sealed;
      const ctx = keeper ? activityContext() : undefined;
      const handedOver = ctx
        ? keeper!.adopt(ctx, { captureKey: key }, async (signal) => report(await post(signal)), { beforeComplete: deliver, keepAs: key })
        : undefined;
      if (handedOver) throw handedOver;
      const r = report(await heartbeating({ captureKey: key }, post));
      const client = deliver && workerClient();
      return client ? deliver(client, r) : r;
    },
  };
}

export type RolloutActivities = ReturnType<typeof createRolloutActivities>;

/**
 * Sends a completed report to its shard (in a batch with others of this worker) and marks it
 * `reported` (the attempt does not send it again). Any other report is left to the attempt, which
 * retires the attempt first. A shard that is gone leaves the report to the attempt too; other
 * failures are retried by the caller (a second signal of the same report is a duplicate the shard
 * ignores).
 */
export async function deliverReport(client: Client, reportTo: string, report: RolloutReport): Promise<RolloutReport> {
  if (report.status !== 'completed' || report.reported) return report;
  const delivery = await reportBatchesOf(client).deliver(reportTo, report);
  return delivery === 'sent' ? { ...report, reported: true } : report;
}

/**
 * A retry asks the attempt's shard whether an earlier try's report already sealed the attempt, and
 * if so completes with it, without a `/run`. That try's worker may have died after the report went
 * out and before the server took the activity's completion (so no run keeper kept it), and Gym may
 * have restarted since, its kept reply gone: a `/run` now would report the sealed attempt failed.
 * The first try does not ask (nothing can have sealed it); a question that fails is only logged.
 */
async function sealedReport(reportTo: string, input: RunEpisodeInput, start: number): Promise<RolloutReport | undefined> {
  const ctx = activityContext();
  const client = workerClient();
  if (!ctx || !client || ctx.info.attempt <= 1) return undefined;
  const key = captureKey(input.episode);
  let sealed: SealedOutcome | null;
  try {
    sealed = await heartbeating({ captureKey: key }, () => client.workflow.getHandle(reportTo).query(sealedAttempt, input.episode));
  } catch (err) {
    if (ctx.cancellationSignal.aborted) throw err;
    ctx.log.warn('a retried /run could not ask its shard whether the attempt is sealed', { captureKey: key, error: errorMessage(err) });
    return undefined;
  }
  if (!sealed) return undefined;
  ctx.log.warn("a retried activity completes with the outcome its shard sealed from an earlier try's report", { captureKey: key, try: ctx.info.attempt });
  const episode = { rollout_id: input.episode.rollout_id, attempt: input.episode.attempt };
  const result = { reward: sealed.reward, mask_sample: sealed.mask_sample };
  return {
    captureKey: key,
    episode,
    status: 'completed',
    reward: sealed.reward,
    terminal: false,
    result,
    seconds: (Date.now() - start) / 1000,
    reported: true,
  };
}

/** The worker's client in this activity; none in a mock environment. */
function workerClient(): Client | undefined {
  try {
    return activityContext()?.client;
  } catch {
    return undefined;
  }
}

/** Builds a sibling's task from its dataset reference (deterministic: the same task every time). */
export function taskFromRef(ref: TaskRef): Task {
  const group = {
    group_id: ref.group_id ?? groupIdOf(ref.seed, ref.prompt_index),
    prompt_index: ref.prompt_index,
    size: ref.group_size,
    task: taskAt(ref.seed, ref.prompt_index, ref.tasksets as Taskset[]),
  };
  return siblingTask(group, ref.sibling, ref.group_attempt ?? 0);
}
