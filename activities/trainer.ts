// The trainer as activities (docs/gym-servers.md "The tiny policy", controller.md §2.6, §3.1, §3.7):
// a real GRPO update of the tiny policy's logits (activities/grpo.ts), a refit of the inference
// backend (`POST /_ctl/policy`), and trainer anchors `step_<N>/trainer.json`.
//
// The trainer state lives IN MEMORY in the worker process, keyed by run, like a GPU trainer's: a
// worker crash loses it, and the anchors are its durable copies. A fresh worker reloads the newest
// valid anchor (or the initial weights at version 0) and refits the backend to it; if that is older
// than the workflow expects, `trainStep` fails with `trainer_behind` and the workflow re-sends the
// batches after the anchor. Updates are deterministic, so a re-sent batch reproduces the lost step.
//
// Which model calls train a sibling: those of its capture keys (the continued attempt chain) that
// returned, assembled into one trajectory (a later attempt supersedes an earlier one's calls from
// the point it continued from), and sampled under the policy version the rollout ran under — the
// sibling's `policyVersion` when the workflow passes it, else the version of the trajectory's first
// call. Calls of another version (a refit or a restore happened mid-rollout) are dropped and
// counted. Older-version rollouts (async lag) are used as they are: the toy has no importance
// correction, as the ledger's "a group resumed at turn mixes weights" caveat already accepts.
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { request } from 'undici';
import { z } from 'zod';
import { FAILURE_TYPES } from '../protocol/controller.js';
import { unpacked, type PackedJson } from '../protocol/packed-json.js';
import { CaptureKeySchema, parseCaptureKey } from '../protocol/ids.js';
import { PolicyWeightsSchema, initialWeights } from '../servers/inference/policy.js';
import { clip, errorMessage, heartbeating, invariantFailure, logger, withStorageFailure, type ActivityLog } from './activity-context.js';
import { joinUrl } from './control-client.js';
import {
  checkOptimizer,
  grpoStep,
  initialOptimizer,
  sortedTable,
  type AdamOptions,
  type AdamState,
  type GrpoCall,
  type GrpoGroup,
  type Table,
} from './grpo.js';
import { canonicalJson, sortKeysDeep } from '../protocol/canonical-json.js';
import { fsyncPath, writeFileDurably } from '../servers/common/durable-files.js';
import { readJsonFile } from './json-file.js';
import { readLedgerParts } from './controller-files.js';
import { collectBatch } from './rollout-batches.js';

export const TRAINER_FILE = 'trainer.json';
export const GYM_RESTART_FALLBACK_FILE = 'gym_restart_fallback.json';
export const TRAINER_SCHEMA_VERSION = 1;
export const GYM_RESTART_FALLBACK_SCHEMA_VERSION = 2;
/** Tags our files, so a checkpoint written by another implementation is rejected cleanly (§3.8). */
export const TRAINER_FORMAT = 'rollout-checkpoint/ts-trainer';
export const BOOTSTRAP_ANCHOR = 'bootstrap';

/** Failure types of the trainer (the workflow branches on them). */
export const TRAINER_FAILURE_TYPES = {
  behind: FAILURE_TYPES.trainerBehind,
  ahead: FAILURE_TYPES.trainerAhead,
  /** A checkpoint of a step the trainer has already moved past (and no anchor of it exists). */
  stateChanged: 'trainer_state_changed',
  /** The inference backend did not answer (transport error, 5xx): retryable. */
  backend: 'backend_unavailable',
} as const;

const DEFAULT_HTTP_TIMEOUT_MS = 30_000;
const STEP_ANCHOR = /^step_(0|[1-9][0-9]*)$/;

// --- state ------------------------------------------------------------------------------------

export interface TrainStepResult {
  version: number;
  step: number;
  /** Mean reward of the batch's unmasked siblings. */
  meanReward: number;
  /** Situations whose logits moved (sorted). */
  updatedSituations: string[];
  seconds: number;
  /** Calls that entered the gradient. */
  usedCalls: number;
  droppedCalls: DroppedCalls;
  /** Groups with a non-zero advantage (the rest had equal rewards). */
  contributingGroups: number;
}

export interface DroppedCalls {
  /** Held, abandoned or cut off: no reply reached the agent. */
  notReturned: number;
  /** Made by an earlier attempt after the point a later attempt continued from. */
  superseded: number;
  /** Sampled under another version than the one the rollout ran under. */
  otherVersion: number;
  /** Situation or action the policy does not know. */
  unknown: number;
}

export interface TrainerState {
  run: string;
  version: number;
  step: number;
  logits: Table;
  optimizer: AdamState;
  /** Dataloader cursor recorded with the state (set by a step or a checkpoint). */
  cursor: number;
  /** The last applied step, so a retried activity returns the same result. */
  last?: { expectedVersion: number; digest: string; result: TrainStepResult };
}

/** The worker's trainers, by run name. A process crash loses them, as it would a GPU trainer's. */
const trainerStates = new Map<string, TrainerState>();

/** Serialises one run's trainer operations (a retried attempt may overlap the one it replaces). */
const runLocks = new Map<string, Promise<unknown>>();

async function withRunLock<T>(run: string, fn: () => Promise<T>): Promise<T> {
  const prev = runLocks.get(run) ?? Promise.resolve();
  const next = prev.then(fn, fn);
  const tail = next.catch(() => {});
  runLocks.set(run, tail);
  try {
    return await next;
  } finally {
    if (runLocks.get(run) === tail) runLocks.delete(run);
  }
}

// --- inputs -----------------------------------------------------------------------------------

const NonNegInt = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const Sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, 'must be a SHA-256 hex digest');

export const TrainBatchSchema = z.array(
  z.strictObject({
    group_id: z.string().min(1),
    siblings: z
      .array(
        z.strictObject({
          rollout_id: z.string().min(1),
          reward: z.number().refine(Number.isFinite, 'reward must be finite'),
          mask: z.boolean(),
          /** The attempts whose model calls form the trajectory (e.g. `r`, `r-a1`). */
          captureKeys: z.array(CaptureKeySchema),
          /** The policy version the rollout ran under (default: its first call's). */
          policyVersion: NonNegInt.optional(),
        }),
      )
      .min(1),
  }),
);
export type TrainBatch = z.infer<typeof TrainBatchSchema>;

export const TrainStepInputSchema = z.strictObject({
  run: z.string().min(1),
  checkpointDir: z.string().min(1),
  /** The run config's `trainer.kind` (default `tiny_grpo`); `none` collects the batch (rollout-batches.ts). */
  trainer: z.enum(['tiny_grpo', 'none', 'external']).optional(),
  /** The inference backend to refit (`tiny_grpo`). */
  backendUrl: z.string().min(1).optional(),
  /** The Gym run dir, where `none` finds the policy model servers' capture. */
  gymRunDir: z.string().min(1).optional(),
  /** The version the trainer must hold before this step (the result has expectedVersion + 1). */
  expectedVersion: NonNegInt,
  /** The step this batch produces (the trainer's step + 1). */
  step: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  /** The batch itself, or `batchFiles`: the files its parts were written to (readTrainBatch reads them). */
  batch: TrainBatchSchema.optional(),
  batchFiles: z.array(z.string().min(1)).optional(),
  /** Dataloader cursor after this batch, kept with the state. */
  cursor: NonNegInt.optional(),
});
export type TrainStepInput = z.infer<typeof TrainStepInputSchema>;

/**
 * A step's batch from its input: inline, or read from the files its rollout shards wrote (the
 * workflow sends files: a batch of thousands of rollouts is over what a payload should carry).
 */
export async function readTrainBatch(input: Pick<TrainStepInput, 'batch' | 'batchFiles'>): Promise<TrainBatch> {
  if ((input.batch === undefined) === (input.batchFiles === undefined)) throw invariantFailure('trainStep: exactly one of batch and batchFiles is required');
  if (input.batch) return input.batch;
  const parts: unknown[] = [];
  for (const file of input.batchFiles!) {
    const read = await readJsonFile(file, TrainBatchSchema, (what) => invariantFailure(`batch part ${file}: ${what}`));
    if (!read) throw invariantFailure(`batch part ${file} is missing`);
    parts.push(...read.data);
  }
  return parts as TrainBatch;
}

function parseInput<S extends z.ZodType>(schema: S, input: unknown, what: string): z.infer<S> {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  const i = r.error.issues[0]!;
  throw invariantFailure(`${what}: invalid input at ${i.path.join('.') || '(root)'}: ${i.message}`);
}

// --- durable files ----------------------------------------------------------------------------

const sha256 = (s: string): string => createHash('sha256').update(s, 'utf8').digest('hex');
const isErrno = (err: unknown, code: string): boolean => (err as NodeJS.ErrnoException | null)?.code === code;

/** `mkdir -p` of `<checkpointDir>/<anchor>`, fsyncing the parents whose entries may be new. */
async function ensureAnchorDir(checkpointDir: string, anchor: string): Promise<string> {
  const dir = path.join(checkpointDir, anchor);
  await fsp.mkdir(dir, { recursive: true });
  await fsyncPath(checkpointDir);
  await fsyncPath(path.dirname(checkpointDir)).catch(() => {});
  return dir;
}

const storage = withStorageFailure;

// --- trainer anchors ----------------------------------------------------------------------------

export function stepAnchor(step: number): string {
  return `step_${step}`;
}

const Finite = z.number().refine(Number.isFinite, 'must be finite');
const TableSchema = z.record(z.string(), z.record(z.string(), Finite));

const AdamStateSchema = z.strictObject({
  kind: z.literal('adam'),
  lr: Finite,
  beta1: Finite,
  beta2: Finite,
  eps: Finite,
  t: NonNegInt,
  m: TableSchema,
  v: TableSchema,
});

export const TrainerAnchorSchema = z.strictObject({
  schema_version: z.literal(TRAINER_SCHEMA_VERSION),
  format: z.literal(TRAINER_FORMAT),
  run: z.string().min(1),
  step: NonNegInt,
  version: NonNegInt,
  cursor: NonNegInt,
  logits: TableSchema,
  optimizer: AdamStateSchema,
  /** SHA-256 of the canonical JSON of every other field. */
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
});
export type TrainerAnchorFile = z.infer<typeof TrainerAnchorSchema>;

export interface SkippedAnchor {
  anchor: string;
  reason: string;
}

export interface TrainerAnchorInfo {
  /** `step_<N>`. */
  anchor: string;
  step: number;
  version: number;
  cursor: number;
  /** Newer anchors that did not validate, newest first. */
  skipped: SkippedAnchor[];
}

function anchorBody(st: TrainerState): Omit<TrainerAnchorFile, 'sha256'> {
  return {
    schema_version: TRAINER_SCHEMA_VERSION,
    format: TRAINER_FORMAT,
    run: st.run,
    step: st.step,
    version: st.version,
    cursor: st.cursor,
    logits: sortedTable(st.logits),
    optimizer: { ...st.optimizer, m: sortedTable(st.optimizer.m), v: sortedTable(st.optimizer.v) },
  };
}

/** The file's text: sorted keys, the digest of the body alongside it. */
export function encodeTrainerAnchor(st: TrainerState): string {
  const body = anchorBody(st);
  return `${JSON.stringify(sortKeysDeep({ ...body, sha256: sha256(canonicalJson(body)) }), null, 1)}\n`;
}

class CorruptAnchor extends Error {}

/** Parses and verifies a trainer.json text; throws CorruptAnchor saying why. */
export function decodeTrainerAnchor(text: string, expect: { step?: number; run?: string } = {}): TrainerState {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new CorruptAnchor(`${TRAINER_FILE} is not JSON: ${errorMessage(err)}`);
  }
  const parsed = TrainerAnchorSchema.safeParse(raw);
  if (!parsed.success) {
    const i = parsed.error.issues[0]!;
    throw new CorruptAnchor(`${TRAINER_FILE} is invalid at ${i.path.join('.') || '(root)'}: ${i.message}`);
  }
  const { sha256: digest, ...body } = parsed.data;
  if (sha256(canonicalJson(body)) !== digest) throw new CorruptAnchor(`${TRAINER_FILE} does not match its sha256`);
  const weights = PolicyWeightsSchema.safeParse({ version: body.version, logits: body.logits });
  if (!weights.success) throw new CorruptAnchor(`${TRAINER_FILE} logits: ${weights.error.issues[0]!.message}`);
  const bad = checkOptimizer(body.optimizer);
  if (bad) throw new CorruptAnchor(`${TRAINER_FILE} optimizer: ${bad}`);
  if (expect.step !== undefined && body.step !== expect.step) throw new CorruptAnchor(`${TRAINER_FILE} is of step ${body.step}, not ${expect.step}`);
  if (expect.run !== undefined && body.run !== expect.run) throw new CorruptAnchor(`${TRAINER_FILE} belongs to run '${body.run}', not '${expect.run}'`);
  return { run: body.run, version: body.version, step: body.step, logits: body.logits, optimizer: body.optimizer, cursor: body.cursor };
}

/** `step_<N>` directories, N descending. */
async function listStepAnchors(checkpointDir: string): Promise<{ anchor: string; step: number }[]> {
  let entries: import('node:fs').Dirent[];
  try {
    entries = await fsp.readdir(checkpointDir, { withFileTypes: true });
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return [];
    throw err;
  }
  const out: { anchor: string; step: number }[] = [];
  for (const e of entries) {
    const m = e.isDirectory() ? STEP_ANCHOR.exec(e.name) : null;
    if (m && Number.isSafeInteger(Number(m[1]))) out.push({ anchor: e.name, step: Number(m[1]) });
  }
  return out.sort((a, b) => b.step - a.step);
}

/** Reads one anchor: the state, `'missing'` (no trainer.json: a directory snapshots created), or CorruptAnchor. */
async function readAnchor(checkpointDir: string, anchor: string, step: number, run?: string): Promise<TrainerState | 'missing'> {
  let text: string;
  try {
    text = await fsp.readFile(path.join(checkpointDir, anchor, TRAINER_FILE), 'utf8');
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return 'missing';
    throw err;
  }
  return decodeTrainerAnchor(text, { step, ...(run !== undefined ? { run } : {}) });
}

/** The newest anchor that validates (optionally of one run), with the newer ones it skipped. */
async function newestAnchor(
  checkpointDir: string,
  run?: string,
): Promise<{ anchor: string; state: TrainerState; skipped: SkippedAnchor[] } | { anchor: null; skipped: SkippedAnchor[] }> {
  const skipped: SkippedAnchor[] = [];
  for (const { anchor, step } of await listStepAnchors(checkpointDir)) {
    try {
      const state = await readAnchor(checkpointDir, anchor, step, run);
      if (state === 'missing') continue;
      return { anchor, state, skipped };
    } catch (err) {
      if (!(err instanceof CorruptAnchor)) throw err;
      skipped.push({ anchor, reason: err.message });
    }
  }
  return { anchor: null, skipped };
}

function initialState(run: string, adam: AdamOptions): TrainerState {
  const w = initialWeights();
  return { run, version: w.version, step: 0, logits: sortedTable(w.logits), optimizer: initialOptimizer(adam), cursor: 0 };
}

// --- the backend ----------------------------------------------------------------------------------

const CallRecordSchema = z.looseObject({
  index: z.number().optional(),
  capture_key: z.string(),
  attempt: z.number().optional(),
  n_messages: z.number(),
  situation: z.string(),
  action: z.string(),
  version: z.number(),
  returned: z.boolean().optional(),
});
export type CallRecordLike = z.infer<typeof CallRecordSchema>;

function backendFailure(message: string, details: Record<string, unknown>): ApplicationFailure {
  return ApplicationFailure.retryable(clip(message, 2_000), TRAINER_FAILURE_TYPES.backend, details);
}

async function backendCall(
  base: string,
  method: 'GET' | 'POST',
  route: string,
  body: unknown,
  timeoutMs: number,
  signal: AbortSignal | undefined,
): Promise<unknown> {
  const url = joinUrl(base, route);
  let status: number;
  let text: string;
  try {
    const res = await request(url, {
      method,
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
      ...(body !== undefined ? { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } } : {}),
      ...(signal ? { signal } : {}),
    });
    status = res.statusCode;
    text = await res.body.text();
  } catch (err) {
    if (signal?.aborted) throw err; // heartbeating turns it into the cancellation
    throw backendFailure(`${method} ${url}: ${errorMessage(err)}`, { url, code: (err as { code?: unknown }).code ?? null });
  }
  if (status >= 500) throw backendFailure(`${method} ${url}: HTTP ${status} ${clip(text)}`, { url, status });
  // A 4xx will not change on retry: the backend is not a tiny policy, or it refused our weights.
  if (status >= 400) throw invariantFailure(`${method} ${url}: HTTP ${status} ${clip(text)}`, { url, status });
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw invariantFailure(`${method} ${url}: reply is not JSON: ${errorMessage(err)}`, { url });
  }
}

/** `POST /_ctl/policy`: the backend serves `{version, logits}` from now on. */
async function refit(base: string, st: TrainerState, timeoutMs: number, signal: AbortSignal | undefined): Promise<void> {
  const reply = (await backendCall(base, 'POST', '/_ctl/policy', { version: st.version, logits: st.logits }, timeoutMs, signal)) as {
    version?: unknown;
  } | null;
  if (reply?.version !== st.version) throw invariantFailure(`refit of ${base}: the backend reports version ${String(reply?.version)}, not ${st.version}`);
}

async function fetchCallLog(base: string, timeoutMs: number, signal: AbortSignal | undefined): Promise<CallRecordLike[]> {
  const raw = await backendCall(base, 'GET', '/_ctl/calls', undefined, timeoutMs, signal);
  const parsed = z.array(CallRecordSchema).safeParse(raw);
  if (!parsed.success) {
    const i = parsed.error.issues[0]!;
    throw invariantFailure(`GET ${joinUrl(base, '/_ctl/calls')}: not a call log at ${i.path.join('.')}: ${i.message}`);
  }
  return parsed.data;
}

// --- trajectories -----------------------------------------------------------------------------------

export interface SiblingTrajectory {
  calls: GrpoCall[];
  /** The version the rollout ran under, or null when it made no returned call. */
  version: number | null;
  dropped: Omit<DroppedCalls, 'unknown'>;
}

/**
 * The model calls of one sibling from the call log. Attempts later in the chain supersede earlier
 * ones from where they continued: walking attempts newest first, an attempt's calls count only
 * below the smallest `n_messages` kept so far (a restored attempt's first call has the same
 * conversation length as the original's call at that turn; a restart from the task starts at the
 * bottom and supersedes everything). Within an attempt a repeated conversation length keeps the
 * latest call. Then only calls of the rollout's version stay (see the file comment).
 */
export function siblingTrajectory(log: readonly CallRecordLike[], captureKeys: readonly string[], policyVersion?: number): SiblingTrajectory {
  const keys = new Set(captureKeys);
  const dropped = { notReturned: 0, superseded: 0, otherVersion: 0 };
  const byAttempt = new Map<number, Map<number, CallRecordLike>>();
  log.forEach((c) => {
    if (!keys.has(c.capture_key)) return;
    if (c.returned !== true) {
      dropped.notReturned += 1;
      return;
    }
    const attempt = c.attempt ?? parseCaptureKey(c.capture_key)?.attempt ?? 0;
    const calls = byAttempt.get(attempt) ?? new Map<number, CallRecordLike>();
    byAttempt.set(attempt, calls);
    if (calls.has(c.n_messages)) dropped.superseded += 1;
    calls.set(c.n_messages, c); // the log is in arrival order: the latest wins
  });
  const kept: CallRecordLike[] = [];
  let floor = Infinity;
  for (const attempt of [...byAttempt.keys()].sort((a, b) => b - a)) {
    const calls = [...byAttempt.get(attempt)!.values()];
    const below = calls.filter((c) => c.n_messages < floor);
    dropped.superseded += calls.length - below.length;
    kept.push(...below);
    for (const c of below) floor = Math.min(floor, c.n_messages);
  }
  kept.sort((a, b) => a.n_messages - b.n_messages);
  const version = policyVersion ?? kept[0]?.version ?? null;
  const calls: GrpoCall[] = [];
  for (const c of kept) {
    if (c.version !== version) dropped.otherVersion += 1;
    else calls.push({ situation: c.situation, action: c.action });
  }
  return { calls, version, dropped };
}

// --- activities ---------------------------------------------------------------------------------------

export interface TrainerDeps {
  /** Adam hyperparameters for a trainer that starts from the initial weights (anchors carry their own). */
  adam?: AdamOptions;
  /** Bound on one backend call. */
  httpTimeoutMs?: number;
  /** Where skipped anchors and empty batches are reported; default the activity logger. */
  log?: ActivityLog;
  /** The in-memory trainers (default: the worker's module-level map). */
  states?: Map<string, TrainerState>;
}

export interface SaveTrainerCheckpointInput {
  run: string;
  checkpointDir: string;
  step: number;
  /** The dataloader cursor the anchor records. */
  cursor: number;
  /**
   * Write the anchor's Gym-restart fallback marker in the same call, right after the anchor is
   * durable (controller.md §2.6 steps 2–3): a run lost between two activities left an anchor
   * without its marker, which a cold start must refuse.
   */
  gymRestartFallback?: { topologyFingerprint: string; ledger: Record<string, unknown> | PackedJson } | GymRestartFallbackParts;
}

/** The ledger of a fallback marker as its rollout shards wrote it: parts in `dir`, merged into the marker (with the run's cursor). */
export interface GymRestartFallbackParts {
  topologyFingerprint: string;
  ledgerParts: { dir: string; files: string[] };
}

async function fallbackLedger(f: NonNullable<SaveTrainerCheckpointInput['gymRestartFallback']>, run: string, cursor: number): Promise<Record<string, unknown>> {
  if ('ledger' in f) return unpacked(f.ledger) as Record<string, unknown>;
  const merged = await readLedgerParts(f.ledgerParts.dir, f.ledgerParts.files);
  return { ...merged, run, cursor };
}

export interface SavedTrainerCheckpoint {
  /** `step_<N>`. */
  anchor: string;
  path: string;
  version: number;
  sha256: string;
}

export interface WriteGymRestartFallbackInput {
  checkpointDir: string;
  step: number;
  trainerVersion: number;
  topologyFingerprint: string;
  /** The run's ledger (JSON) as the anchor was written; packed by the run (a payload is ≤ 2 MiB). */
  ledger: Record<string, unknown> | PackedJson;
}

export interface GymRestartFallback {
  schema_version: number;
  base_train_step: number;
  trainer_version: number;
  gym_topology_fingerprint: string;
  /** As written; not read back into a workflow (each rollout shard loads its slice from the file). */
  ledger: Record<string, unknown>;
}

/** The marker as `readGymRestartFallback` answers it: without the ledger, and where it is. */
export type GymRestartFallbackInfo = Omit<GymRestartFallback, 'ledger'> & { file: string; cursor: number };

export const GymRestartFallbackSchema = z.strictObject({
  schema_version: z.literal(GYM_RESTART_FALLBACK_SCHEMA_VERSION),
  base_train_step: NonNegInt,
  trainer_version: NonNegInt,
  gym_topology_fingerprint: z.string().regex(/^[0-9a-f]{64}$/),
  /**
   * The controller's ledger when the anchor was written: a restore without Gym state keeps its
   * sealed siblings and starts every unfinished one over from its task (§3.7 item 5). Checked
   * against the ledger invariants by the workflow that loads it.
   */
  ledger: z.record(z.string(), z.unknown()),
});

export interface RestoreTrainerInput {
  run: string;
  checkpointDir: string;
  /** The inference backend to refit; the workflow leaves it out when the deployment has none (an external trainer refits its own). */
  backendUrl?: string;
  /** `step_<N>` or `bootstrap` (initial weights); default the newest valid anchor. */
  anchor?: string;
  /** A new run taking over an anchor another run wrote (a cold `restore_mode: latest` start). */
  adopt?: boolean;
}

export interface RestoredTrainer {
  version: number;
  step: number;
  cursor: number;
  /** `step_<N>`, or `bootstrap` for the initial weights. */
  anchor: string;
  skipped: SkippedAnchor[];
}

function markerPath(checkpointDir: string, step: number): string {
  return path.join(checkpointDir, stepAnchor(step), GYM_RESTART_FALLBACK_FILE);
}

async function writeMarkerFile(
  checkpointDir: string,
  step: number,
  trainerVersion: number,
  topologyFingerprint: string,
  ledger: Record<string, unknown>,
): Promise<{ path: string }> {
  const file = markerPath(checkpointDir, step);
  const marker: GymRestartFallback = {
    schema_version: GYM_RESTART_FALLBACK_SCHEMA_VERSION,
    base_train_step: step,
    trainer_version: trainerVersion,
    gym_topology_fingerprint: topologyFingerprint,
    ledger,
  };
  await writeFileDurably(file, `${JSON.stringify(sortKeysDeep(marker), null, 1)}\n`);
  return { path: file };
}

/**
 * For a trainer of its own (activities/trainer-role.ts): writes the Gym-restart fallback marker
 * of `saveTrainerCheckpoint`'s input, once that trainer's anchor of the step is durable.
 */
export async function writeGymRestartFallbackMarker(input: SaveTrainerCheckpointInput & { trainerVersion: number }): Promise<{ path: string } | null> {
  const f = input.gymRestartFallback;
  if (!f) return null;
  return writeMarkerFile(input.checkpointDir, input.step, input.trainerVersion, f.topologyFingerprint, await fallbackLedger(f, input.run, input.cursor));
}

export function createTrainerActivities(deps: TrainerDeps = {}) {
  const states = deps.states ?? trainerStates;
  const timeoutMs = deps.httpTimeoutMs ?? DEFAULT_HTTP_TIMEOUT_MS;
  const log = logger(deps.log);
  const adam = deps.adam ?? {};
  initialOptimizer(adam); // bad hyperparameters fail at wiring time

  const reportSkipped = (where: string, skipped: SkippedAnchor[]): void => {
    if (skipped.length) log('corrupt trainer anchors skipped', { checkpointDir: where, skipped });
  };

  /** `expected`: what the caller needed, for the message only (`version 5`, `step 5`). */
  const behind = (have: number, step: number, expected: string): ApplicationFailure =>
    ApplicationFailure.nonRetryable(
      `the trainer holds version ${have} (step ${step}), the caller expected ${expected}: re-send the batches after step ${step}`,
      TRAINER_FAILURE_TYPES.behind,
      { have, step },
    );

  /** The run's state, or the newest anchor (else the initial weights) loaded and refitted. */
  async function stateOf(run: string, checkpointDir: string, backendUrl: string, signal: AbortSignal | undefined): Promise<TrainerState> {
    const have = states.get(run);
    if (have) return have;
    const found = await storage(`reading trainer anchors in ${checkpointDir}`, () => newestAnchor(checkpointDir, run));
    reportSkipped(checkpointDir, found.skipped);
    const st = found.anchor === null ? initialState(run, adam) : found.state;
    await refit(backendUrl, st, timeoutMs, signal);
    states.set(run, st);
    return st;
  }

  /** `trainer: external` reached this worker's own trainer: the external one's activities are not registered. */
  const notExternal = (): ApplicationFailure =>
    invariantFailure(
      "trainer external: this worker runs the tiny_grpo trainer; the external trainer must register the trainer role activities (activities/trainer-role.ts) on the run's task queue",
    );

  /** `trainer: none`: the batch goes to the rollout batches file; the version does not move. */
  async function collectStep(input: TrainStepInput): Promise<TrainStepResult> {
    const start = Date.now();
    if (input.gymRunDir === undefined) throw invariantFailure('trainStep (trainer none): gymRunDir is required');
    const batch = await storage('reading the batch', () => readTrainBatch(input));
    const out = await collectBatch({
      run: input.run,
      checkpointDir: input.checkpointDir,
      gymRunDir: input.gymRunDir,
      step: input.step,
      policyVersion: input.expectedVersion,
      batch,
    });
    const live = batch.flatMap((g) => g.siblings).filter((x) => !x.mask);
    return {
      version: input.expectedVersion,
      step: input.step,
      meanReward: live.length ? live.reduce((a, x) => a + x.reward, 0) / live.length : 0,
      updatedSituations: [],
      seconds: (Date.now() - start) / 1000,
      usedCalls: out.calls,
      droppedCalls: { notReturned: 0, superseded: 0, otherVersion: 0, unknown: 0 },
      contributingGroups: 0,
    };
  }

  async function trainStep(rawInput: TrainStepInput): Promise<TrainStepResult> {
    const input = parseInput(TrainStepInputSchema, rawInput, 'trainStep');
    if (input.trainer === 'none') return collectStep(input);
    if (input.trainer === 'external') throw notExternal();
    const { run, checkpointDir, expectedVersion, step } = input;
    const batch = await storage('reading the batch', () => readTrainBatch(input));
    if (input.backendUrl === undefined) throw invariantFailure('trainStep (tiny_grpo): backendUrl is required');
    const backendUrl = input.backendUrl;
    const digest = sha256(canonicalJson({ run, expectedVersion, step, cursor: input.cursor ?? null, batch }));
    return heartbeating({ op: 'trainStep', run, step }, (signal) =>
      withRunLock(run, async () => {
        const start = Date.now();
        const st = await stateOf(run, checkpointDir, backendUrl, signal);
        if (st.version === expectedVersion + 1 && st.last?.digest === digest) {
          // A retry of an applied step: make sure the backend serves it, answer the same.
          await refit(backendUrl, st, timeoutMs, signal);
          return st.last.result;
        }
        if (st.version < expectedVersion) throw behind(st.version, st.step, `version ${expectedVersion}`);
        if (st.version > expectedVersion) {
          throw ApplicationFailure.nonRetryable(
            `the trainer holds version ${st.version} (step ${st.step}), past the expected ${expectedVersion}${st.version === expectedVersion + 1 ? ' with another batch' : ''}: restore a trainer anchor`,
            TRAINER_FAILURE_TYPES.ahead,
            { have: st.version, step: st.step, expected: expectedVersion },
          );
        }
        if (step !== st.step + 1)
          throw invariantFailure(`trainStep: step ${step} does not follow the trainer's step ${st.step} (version ${st.version})`, {
            have: st.version,
            step: st.step,
          });

        // One pass over the whole log (it grows with the run), then each sibling reads only its keys.
        const byKey = new Map<string, CallRecordLike[]>();
        for (const c of await fetchCallLog(backendUrl, timeoutMs, signal)) {
          const list = byKey.get(c.capture_key);
          if (list) list.push(c);
          else byKey.set(c.capture_key, [c]);
        }
        const dropped: DroppedCalls = { notReturned: 0, superseded: 0, otherVersion: 0, unknown: 0 };
        const groups: GrpoGroup[] = batch.map((g) => ({
          siblings: g.siblings.map((s) => {
            const own = [...new Set(s.captureKeys)].flatMap((k) => byKey.get(k) ?? []); // arrival order within each attempt
            const t = siblingTrajectory(own, s.captureKeys, s.policyVersion);
            dropped.notReturned += t.dropped.notReturned;
            dropped.superseded += t.dropped.superseded;
            dropped.otherVersion += t.dropped.otherVersion;
            return { reward: s.reward, mask: s.mask, calls: s.mask ? [] : t.calls };
          }),
        }));
        const r = grpoStep({ logits: st.logits, optimizer: st.optimizer, groups });
        dropped.unknown = r.unknownCalls;
        if (r.usedCalls === 0 && batch.length > 0) log('training step without model calls', { run, step, backendUrl, dropped });
        const next: TrainerState = {
          run,
          version: st.version + 1,
          step,
          logits: r.logits,
          optimizer: r.optimizer,
          cursor: input.cursor ?? st.cursor,
        };
        // Refit before the state is kept: if the refit fails, the retry recomputes the same update.
        await refit(backendUrl, next, timeoutMs, signal);
        const result: TrainStepResult = {
          version: next.version,
          step,
          meanReward: r.meanReward,
          updatedSituations: r.updated,
          seconds: (Date.now() - start) / 1000,
          usedCalls: r.usedCalls,
          droppedCalls: dropped,
          contributingGroups: r.contributingGroups,
        };
        next.last = { expectedVersion, digest, result };
        states.set(run, next);
        return result;
      }),
    );
  }

  async function saveTrainerCheckpoint(packedInput: SaveTrainerCheckpointInput): Promise<SavedTrainerCheckpoint> {
    const fallbackIn = packedInput.gymRestartFallback;
    const input = fallbackIn
      ? {
          ...packedInput,
          gymRestartFallback: {
            topologyFingerprint: fallbackIn.topologyFingerprint,
            ledger: await storage('reading the fallback ledger parts', () => fallbackLedger(fallbackIn, packedInput.run, packedInput.cursor)),
          },
        }
      : packedInput;
    const { run, checkpointDir, step, cursor, gymRestartFallback } = parseInput(
      z.strictObject({
        run: z.string().min(1),
        checkpointDir: z.string().min(1),
        step: NonNegInt,
        cursor: NonNegInt,
        gymRestartFallback: z.strictObject({ topologyFingerprint: Sha256Hex, ledger: z.record(z.string(), z.unknown()) }).optional(),
      }),
      input,
      'saveTrainerCheckpoint',
    );
    const anchor = stepAnchor(step);
    const file = path.join(checkpointDir, anchor, TRAINER_FILE);
    const saved = await heartbeating({ op: 'saveTrainerCheckpoint', run, step }, () =>
      withRunLock(run, () =>
        storage(`writing ${file}`, async (): Promise<SavedTrainerCheckpoint> => {
          const st = states.get(run);
          if (!st || st.step !== step) {
            // A retry after the state moved on (or the worker restarted): the anchor may already be durable.
            const existing = await readAnchor(checkpointDir, anchor, step, run).catch((err: unknown) => {
              if (err instanceof CorruptAnchor) return 'missing' as const;
              throw err;
            });
            if (existing !== 'missing' && existing.cursor === cursor) {
              const text = await fsp.readFile(file, 'utf8');
              return { anchor, path: file, version: existing.version, sha256: (JSON.parse(text) as { sha256: string }).sha256 };
            }
            if (!st) {
              const found = await newestAnchor(checkpointDir, run);
              const have = found.anchor === null ? { version: 0, step: 0 } : found.state;
              throw behind(have.version, have.step, `step ${step}`);
            }
            if (st.step < step) throw behind(st.version, st.step, `step ${step}`);
            throw ApplicationFailure.nonRetryable(
              `cannot save step ${step}: the trainer is at step ${st.step} (version ${st.version})`,
              TRAINER_FAILURE_TYPES.stateChanged,
              { have: st.version, step: st.step },
            );
          }
          st.cursor = cursor;
          await ensureAnchorDir(checkpointDir, anchor);
          const text = encodeTrainerAnchor(st);
          await writeFileDurably(file, text);
          return { anchor, path: file, version: st.version, sha256: (JSON.parse(text) as { sha256: string }).sha256 };
        }),
      ),
    );
    if (gymRestartFallback) {
      // Also on a retry that found the anchor durable: the marker may be what the first try missed.
      // The anchor was just written or read back, so it needs no second check.
      const { topologyFingerprint, ledger } = gymRestartFallback;
      await storage(`writing ${markerPath(checkpointDir, step)}`, () => writeMarkerFile(checkpointDir, step, saved.version, topologyFingerprint, ledger));
    }
    return saved;
  }

  async function writeGymRestartFallback(packedInput: WriteGymRestartFallbackInput): Promise<{ path: string }> {
    const input = { ...packedInput, ledger: unpacked(packedInput.ledger) };
    const { checkpointDir, step, trainerVersion, topologyFingerprint, ledger } = parseInput(
      z.strictObject({
        checkpointDir: z.string().min(1),
        step: NonNegInt,
        trainerVersion: NonNegInt,
        topologyFingerprint: Sha256Hex,
        ledger: z.record(z.string(), z.unknown()),
      }),
      input,
      'writeGymRestartFallback',
    );
    const anchor = stepAnchor(step);
    return storage(`writing ${markerPath(checkpointDir, step)}`, async () => {
      // The marker says "this trainer checkpoint may be restored without Gym state" (§2.6): it must exist.
      let st: TrainerState | 'missing';
      try {
        st = await readAnchor(checkpointDir, anchor, step);
      } catch (err) {
        if (err instanceof CorruptAnchor) throw invariantFailure(`writeGymRestartFallback: ${anchor}: ${err.message}`);
        throw err;
      }
      if (st === 'missing') throw invariantFailure(`writeGymRestartFallback: ${anchor} has no durable ${TRAINER_FILE} yet`);
      if (st.version !== trainerVersion)
        throw invariantFailure(`writeGymRestartFallback: ${anchor} holds trainer version ${st.version}, not ${trainerVersion}`);
      return writeMarkerFile(checkpointDir, step, trainerVersion, topologyFingerprint, ledger);
    });
  }

  async function readGymRestartFallback(input: { checkpointDir: string; anchor: string }): Promise<GymRestartFallbackInfo | null> {
    const file = path.join(input.checkpointDir, input.anchor, GYM_RESTART_FALLBACK_FILE);
    return storage(`reading ${file}`, async () => {
      const read = await readJsonFile(file, GymRestartFallbackSchema, (what) => invariantFailure(`${path.dirname(file)}: ${what}`));
      if (!read) return null;
      const marker = read.data;
      if (STEP_ANCHOR.test(input.anchor) && marker.base_train_step !== Number(input.anchor.slice(5))) {
        throw invariantFailure(`${file} names step ${marker.base_train_step}, not its anchor's`);
      }
      // Without the ledger: each rollout shard loads its slice from the file (loadLedgerSlice).
      const { ledger, ...info } = marker;
      const cursor = typeof ledger.cursor === 'number' ? ledger.cursor : 0;
      return { ...info, file, cursor };
    });
  }

  async function restoreTrainer(input: RestoreTrainerInput): Promise<RestoredTrainer> {
    const { run, checkpointDir, backendUrl, anchor, adopt } = parseInput(
      z.strictObject({
        run: z.string().min(1),
        checkpointDir: z.string().min(1),
        backendUrl: z.string().min(1).optional(),
        anchor: z.string().min(1).optional(),
        adopt: z.boolean().optional(),
      }),
      input,
      'restoreTrainer',
    );
    if (backendUrl === undefined) throw invariantFailure('restoreTrainer (tiny_grpo): backendUrl is required');
    return heartbeating({ op: 'restoreTrainer', run }, (signal) =>
      withRunLock(run, async () => {
        let st: TrainerState;
        let name: string;
        let skipped: SkippedAnchor[] = [];
        if (anchor === undefined) {
          const found = await storage(`reading trainer anchors in ${checkpointDir}`, () => newestAnchor(checkpointDir, run));
          skipped = found.skipped;
          reportSkipped(checkpointDir, skipped);
          if (found.anchor === null) {
            st = initialState(run, adam);
            name = BOOTSTRAP_ANCHOR;
          } else {
            st = found.state;
            name = found.anchor;
          }
        } else if (anchor === BOOTSTRAP_ANCHOR) {
          st = initialState(run, adam);
          name = BOOTSTRAP_ANCHOR;
        } else {
          const m = STEP_ANCHOR.exec(anchor);
          if (!m) throw invariantFailure(`restoreTrainer: ${JSON.stringify(anchor)} is neither ${BOOTSTRAP_ANCHOR} nor step_<N>`);
          const got = await storage(`reading ${path.join(checkpointDir, anchor, TRAINER_FILE)}`, async () => {
            try {
              return await readAnchor(checkpointDir, anchor, Number(m[1]), adopt ? undefined : run);
            } catch (err) {
              if (err instanceof CorruptAnchor) throw invariantFailure(`restoreTrainer: ${anchor}: ${err.message}`, { anchor });
              throw err;
            }
          });
          if (got === 'missing') throw invariantFailure(`restoreTrainer: ${anchor} has no ${TRAINER_FILE}`, { anchor });
          st = adopt ? { ...got, run } : got;
          name = anchor;
        }
        await refit(backendUrl, st, timeoutMs, signal);
        states.set(run, st);
        return { version: st.version, step: st.step, cursor: st.cursor, anchor: name, skipped };
      }),
    );
  }

  async function latestTrainerAnchor(input: { checkpointDir: string; run?: string }): Promise<TrainerAnchorInfo | null> {
    return heartbeating({ op: 'latestTrainerAnchor' }, () =>
      storage(`reading trainer anchors in ${input.checkpointDir}`, async () => {
        const found = await newestAnchor(input.checkpointDir, input.run);
        reportSkipped(input.checkpointDir, found.skipped);
        if (found.anchor === null) return null;
        const st = found.state;
        return { anchor: found.anchor, step: st.step, version: st.version, cursor: st.cursor, skipped: found.skipped };
      }),
    );
  }

  /** Forgets the run's in-memory trainer (tests simulate a trainer crash with it). */
  async function dropTrainerState(input: { run: string }): Promise<{ dropped: boolean }> {
    return withRunLock(input.run, async () => ({ dropped: states.delete(input.run) }));
  }

  return { trainStep, saveTrainerCheckpoint, writeGymRestartFallback, readGymRestartFallback, restoreTrainer, latestTrainerAnchor, dropTrainerState };
}

export type TrainerActivities = ReturnType<typeof createTrainerActivities>;

/** A copy of the run's in-memory trainer state (tests, status). */
export function peekTrainerState(run: string, states: Map<string, TrainerState> = trainerStates): TrainerState | undefined {
  const st = states.get(run);
  return st ? structuredClone(st) : undefined;
}
