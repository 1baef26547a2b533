// The Gym coordination activities: discovery and one control-plane fan-out per activity
// (control-plane.md §11), with CoordinationErrors turned into typed ApplicationFailures that the
// checkpoint workflow branches on (docs/controller.md "Activities").
import { createHash } from 'node:crypto';
import path from 'node:path';
import type { Dispatcher } from 'undici';
import { ApplicationFailure } from '@temporalio/common';
import {
  FAILURE_TYPES,
  GYM_COMMIT_FILE,
  commitSummaries,
  type GymCommitFile,
  type GymCommitOutcome,
  type GymMember,
  type GymParticipantCommit,
  type GymPrepareOutcome,
  type GymRestoreOutcome,
  type EnvironmentCapabilities,
  type GymTopology,
} from '../protocol/controller.js';
import { captureKey, parseCaptureKey, type CaptureKey, type EpisodeId } from '../protocol/ids.js';
import { EndpointsSchema, type Endpoints } from '../servers/common/deployment.js';
import { readCandidates, readScopeParts, writeRestored } from './controller-files.js';
import { writeGymCommitFile } from './gym-commit-file.js';
import { readJsonFile } from './json-file.js';
import {
  activityContext,
  checkSeconds,
  clip,
  clipMessage,
  errorMessage,
  heartbeating,
  invariantFailure,
  logger,
  storageFailure,
  type ActivityLog,
} from './activity-context.js';
import {
  commit,
  committedEnvironmentKeys,
  discover,
  failureClass,
  forget,
  isCoordinationError,
  prepare,
  preparedBlockers,
  preparedRestarts,
  refusalCode,
  renew,
  restore,
  resume,
  retire,
  sortMembers,
  type Participants,
} from './coordination.js';

export interface GymActivityDeps {
  controlToken: string;
  /** The reserved control pool (§11.9). */
  controlPool: Dispatcher;
  log?: ActivityLog;
}

export const ENDPOINTS_FILE = 'endpoints.json';

/** SHA-256 hex of the sorted `name:kind` lines of the members (one per line). */
export function topologyFingerprint(members: readonly { name: string; kind: string }[]): string {
  const lines = members.map((m) => `${m.name}:${m.kind}`).sort();
  return createHash('sha256').update(lines.join('\n'), 'utf8').digest('hex');
}

/** The details of a Gym ApplicationFailure (its `details[0]`). */
export interface GymFailureDetails {
  operation: string;
  /** Server name → what went wrong there. */
  failures: Record<string, string>;
  /** The servers that could not be reached (connection refused or broken), when any. */
  unreachable?: string[];
  /** Of those, the ones where nothing listens (connection refused): their processes are gone. */
  refused?: string[];
}

/**
 * A coordination error as the ApplicationFailure workflows branch on:
 * a refusal → non-retryable, typed by its code; a protocol violation (or a deployment-level
 * failure such as "no policy model") → non-retryable `invariant_error`; otherwise (transport,
 * 5xx, timeouts, `deadline_exceeded` and other retryable refusals) → retryable `gym_transient`.
 * Anything that is not a coordination error is a bug on our side: `invariant_error`.
 */
export function gymFailure(err: unknown): unknown {
  if (err instanceof ApplicationFailure) return err;
  if (!isCoordinationError(err)) return invariantFailure(`unexpected error: ${errorMessage(err)}`);
  const failures: Record<string, string> = {};
  for (const [name, f] of Object.entries(err.failures)) failures[name] = clip(f.description);
  // Servers that could not be reached at all: a Gym that is down or restarting, not one that failed.
  const unreachable = Object.keys(err.failures)
    .filter((name) => err.failures[name]!.unreachable)
    .sort();
  const refused = unreachable.filter((name) => err.failures[name]!.refused);
  const details: GymFailureDetails = {
    operation: err.operation,
    failures,
    ...(unreachable.length ? { unreachable } : {}),
    ...(refused.length ? { refused } : {}),
  };
  const message = clipMessage(err.message);
  const code = refusalCode(err);
  if (code !== undefined) return ApplicationFailure.nonRetryable(message, code, details);
  const classes = Object.values(err.failures).map(failureClass);
  if (classes.length === 0 || classes.includes('protocol_violation')) {
    return ApplicationFailure.nonRetryable(message, FAILURE_TYPES.invariant, details);
  }
  return ApplicationFailure.retryable(message, FAILURE_TYPES.transient, details);
}

async function gymCall<T>(details: unknown, fn: (signal: AbortSignal | undefined) => Promise<T>): Promise<T> {
  try {
    return await heartbeating(details, fn);
  } catch (err) {
    // heartbeating already replaced the error by the cancellation when the activity was cancelled.
    if (activityContext()?.cancellationSignal.aborted) throw err;
    throw gymFailure(err);
  }
}

function participantsOf(token: string, pool: Dispatcher, topology: GymTopology): Participants {
  if (!topology || !Array.isArray(topology.members)) throw invariantFailure('topology has no members list');
  return { token, pool, members: sortMembers(topology.members) };
}

/** Absolute epoch seconds `timeoutS` from now. */
function deadlineIn(timeoutS: number): number {
  return Date.now() / 1000 + checkSeconds('timeoutS', timeoutS);
}

const secondsSince = (startMs: number): number => (Date.now() - startMs) / 1000;

// --- inputs and outputs -------------------------------------------------------------------------

export interface DiscoverGymInput {
  runDir: string;
  /** Require a policy model participant (§11.1 step 4). Default false until the model takes part. */
  requireModel?: boolean;
  /** How long each server's status reply is waited for (default 60 s). */
  probeTimeoutS?: number;
}

export interface GymCallInput {
  topology: GymTopology;
  checkpointId: string;
  timeoutS: number;
}

export interface GymCommitInput extends GymCallInput {
  checkpointDir: string;
  /**
   * Every episode the controller continues, as a list (tools, tests) or, from the checkpoint
   * attempt, the candidates its rollout shards wrote into `checkpointDir` (`candidatesFile`) less
   * the restarts Gym reported at prepare.
   */
  scope: EpisodeId[] | { shards: number; restarts: CaptureKey[] };
  /** Stop after this checkpoint instead of resuming; sent only when true. */
  stop?: boolean;
}

export interface GymRenewOutcome {
  checkpointId: string;
  /** server name → lease expiry (epoch seconds). */
  leases: Record<string, number>;
  seconds: number;
}

export interface GymResumeOutcome {
  checkpointId: string;
  /** Servers whose resume was a replay (already idle under this ID). */
  idempotent: string[];
  seconds: number;
}

export interface GymRestoreInput {
  topology: GymTopology;
  /** The restore's own ID (not the source checkpoint's). */
  restoreId: string;
  timeoutS: number;
  /** The published snapshot directory (participants read `<dir>/gym/<kind>/<instance>`). */
  checkpointDir: string;
  /**
   * The checkpointed attempts N to continue: a list (tools, tests) or, from the run, the directory
   * its rollout shards wrote their parts of the scope into (`scopePartFile`); the answer is then
   * written there too (`RESTORED_FILE`) and the outcome carries counts only.
   */
  scope: EpisodeId[] | { dir: string; shards: number };
  /** When given, every participant must report restoring from this checkpoint. */
  sourceCheckpointId?: string;
}

export interface GymRetireInput {
  topology: GymTopology;
  timeoutS: number;
  episodes: EpisodeId[];
  /** Default `retire`; after a restore and before its resume, the restore's ID. */
  checkpointId?: string;
}

export interface GymRetireOutcome {
  /** server name → retired count. */
  retired: Record<string, number>;
  seconds: number;
}

export interface GymForgetInput {
  topology: GymTopology;
  timeoutS: number;
  rolloutIds: string[];
  /** Default `forget`. */
  checkpointId?: string;
}

export interface GymForgetOutcome {
  /** server name → forgotten count. */
  forgotten: Record<string, number>;
  seconds: number;
}

// --- the activities -----------------------------------------------------------------------------

async function readEndpoints(runDir: string): Promise<Endpoints> {
  const file = path.join(runDir, ENDPOINTS_FILE);
  const read = await readJsonFile(file, EndpointsSchema, (what) => invariantFailure(`${runDir}: ${what}`)).catch((err: unknown) => {
    throw err instanceof ApplicationFailure ? err : storageFailure(`cannot read ${file}`, err);
  });
  // Missing: the launcher may not have written it yet; retry.
  if (!read) throw storageFailure(`cannot read ${file}`, { code: 'ENOENT', message: 'no such file or directory' });
  return read.data;
}

type Statuses = Record<string, unknown>;

function capabilitiesOf(statuses: Statuses, name: string): Record<string, unknown> {
  const c = (statuses[name] as { capabilities?: unknown } | undefined)?.capabilities;
  return c !== null && typeof c === 'object' ? (c as Record<string, unknown>) : {};
}

/**
 * Per environment server, what it supports (controller.md §5.6 rule 1), from the `capabilities`
 * each participant reports in status (ours; a server without them is taken at its most
 * conservative: no continuations, restart-only resources).
 */
export function environmentCapabilities(statuses: Statuses): Record<string, EnvironmentCapabilities> {
  const out: Record<string, EnvironmentCapabilities> = {};
  for (const [name, st] of Object.entries(statuses)) {
    if ((st as { kind?: unknown }).kind !== 'environment') continue;
    const env = capabilitiesOf(statuses, name);
    const agent = typeof env.agent === 'string' ? env.agent : '';
    const resources = typeof env.resources === 'string' ? env.resources : '';
    const a = capabilitiesOf(statuses, agent);
    const r = capabilitiesOf(statuses, resources);
    const mode = r.checkpoint_mode;
    const groupSize = r.group_size;
    const cohort = r.cohort_collection_timeout_s;
    out[name] = {
      environment: name,
      agent,
      supports_continuations: a.supports_continuations === true,
      resources_checkpoint_mode: mode === 'stateless' || mode === 'exported' ? mode : 'restart_only',
      verify_replayable: r.checkpoint_verify === 'replay',
      group_size: typeof groupSize === 'number' && Number.isInteger(groupSize) && groupSize > 0 ? groupSize : null,
      cohort_collection_timeout_s: typeof cohort === 'number' && cohort > 0 ? cohort : null,
    };
  }
  return out;
}

export function createGymActivities(deps: GymActivityDeps) {
  const token = deps.controlToken;
  const log = logger(deps.log);

  return {
    /** Reads `<runDir>/endpoints.json` and probes every server except inference ones. */
    async discoverGym(input: DiscoverGymInput): Promise<GymTopology> {
      const endpoints = await readEndpoints(input.runDir);
      const candidates = Object.entries(endpoints)
        .filter(([, e]) => e.kind !== 'inference')
        .map(([name, e]) => ({ name, url: e.url }));
      const found = await gymCall({ op: 'discover' }, (signal) =>
        discover({
          servers: candidates,
          token,
          pool: deps.controlPool,
          requireModel: input.requireModel ?? false,
          ...(input.probeTimeoutS !== undefined ? { probeTimeoutMs: input.probeTimeoutS * 1000 } : {}),
          ...(signal ? { signal } : {}),
        }),
      );
      const members: GymMember[] = found.members.map((m) => ({ name: m.name, url: m.url, kind: m.kind }));
      const servers: GymTopology['servers'] = {};
      for (const [name, e] of Object.entries(endpoints)) servers[name] = { kind: e.kind, url: e.url };
      // Process identities (our status extra): a changed one means that server restarted fresh.
      const instances: Record<string, string> = {};
      for (const [name, st] of Object.entries(found.statuses)) {
        const id = (st as { instance_id?: unknown }).instance_id;
        if (typeof id === 'string') instances[name] = id;
      }
      return { members, servers, fingerprint: topologyFingerprint(members), instances, environments: environmentCapabilities(found.statuses) };
    },

    /** Not prepared is an answer, not an error: the workflow resumes, retires stragglers, and tries a new ID. */
    async gymPrepare(input: GymCallInput): Promise<GymPrepareOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      const result = await gymCall({ op: 'prepare', checkpointId: input.checkpointId }, (signal) =>
        prepare(dep, { checkpointId: input.checkpointId, deadlineTs, ...(signal ? { signal } : {}) }),
      );
      return {
        checkpointId: input.checkpointId,
        prepared: result.prepared,
        restarts: preparedRestarts(result).map(captureKey),
        blockers: preparedBlockers(result),
        seconds: secondsSince(start),
      };
    },

    /**
     * Commit to every member, then the controller-side checks of controller.md §2.3 step 5 (ID,
     * topology, scope): a mismatch is an invariant violation. Participant manifests and records
     * on disk are checked by validateSnapshot before publication.
     */
    async gymCommit(input: GymCommitInput): Promise<GymCommitOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      let scope: EpisodeId[];
      if (Array.isArray(input.scope)) scope = input.scope;
      else {
        const restarts = new Set(input.scope.restarts);
        const candidates = await readCandidates(input.checkpointDir, input.scope.shards).catch((err: unknown) => {
          throw err instanceof ApplicationFailure ? err : storageFailure(`reading the scope candidates in ${input.checkpointDir}`, err);
        });
        scope = candidates.filter((k) => !restarts.has(k)).map((k) => parseCaptureKey(k)!);
      }
      const replies = await gymCall({ op: 'commit', checkpointId: input.checkpointId }, (signal) =>
        commit(dep, {
          checkpointId: input.checkpointId,
          deadlineTs,
          checkpointDir: input.checkpointDir,
          scope,
          ...(input.stop === true ? { stop: true } : {}),
          ...(signal ? { signal } : {}),
        }),
      );
      const scopeKeys = new Set<CaptureKey>(scope.map((e) => captureKey({ rollout_id: e.rollout_id, attempt: e.attempt ?? 0 })));
      const committed: Record<string, GymParticipantCommit> = {};
      const problems: string[] = [];
      for (const m of dep.members) {
        const reply = replies[m.name];
        if (!reply) {
          problems.push(`${m.name}: no commit reply`);
          continue;
        }
        const man = reply.manifest;
        if (man.checkpoint_id !== input.checkpointId) problems.push(`${m.name}: committed checkpoint ${JSON.stringify(man.checkpoint_id)}`);
        if (man.kind !== m.kind) problems.push(`${m.name}: manifest kind ${JSON.stringify(man.kind)}, discovered ${m.kind}`);
        if (man.instance !== m.name) problems.push(`${m.name}: manifest instance ${JSON.stringify(man.instance)}`);
        const outside = reply.episode_ids.filter((k) => !scopeKeys.has(k));
        if (outside.length > 0) problems.push(`${m.name}: committed episodes outside the scope: ${outside.slice(0, 10).join(', ')}`);
        committed[m.name] = {
          kind: man.kind,
          instance: man.instance,
          manifest: man as Record<string, unknown>,
          episode_ids: [...reply.episode_ids],
        };
      }
      for (const name of Object.keys(replies)) {
        if (!dep.members.some((m) => m.name === name)) problems.push(`${name}: replied but is not in the topology`);
      }
      if (problems.length > 0) {
        throw invariantFailure(`commit ${input.checkpointId} does not match the topology or scope: ${problems.join('; ')}`, {
          problems: problems.slice(0, 20).map((p) => clip(p)),
        });
      }
      // The episode lists go to the snapshot directory, not into the workflow's history. No fsync
      // while Gym waits: the publication fsyncs the whole directory before its rename.
      const file: GymCommitFile = { checkpoint_id: input.checkpointId, scope: [...scopeKeys], participants: committed };
      try {
        await writeGymCommitFile(input.checkpointDir, file);
      } catch (err) {
        throw storageFailure(`writing ${GYM_COMMIT_FILE} into ${input.checkpointDir}`, err);
      }
      const environmentKeys = new Set(committedEnvironmentKeys(dep, replies));
      return {
        checkpointId: input.checkpointId,
        participants: commitSummaries(committed),
        scopeCount: file.scope.length,
        uncommitted: file.scope.filter((k) => !environmentKeys.has(k)),
        seconds: secondsSince(start),
      };
    },

    /** Extends the leases while publication runs long. */
    async gymRenew(input: GymCallInput): Promise<GymRenewOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      const replies = await gymCall({ op: 'renew', checkpointId: input.checkpointId }, (signal) =>
        renew(dep, { checkpointId: input.checkpointId, deadlineTs, ...(signal ? { signal } : {}) }),
      );
      const leases: Record<string, number> = {};
      for (const [name, r] of Object.entries(replies)) leases[name] = r.lease_expires_at;
      return { checkpointId: input.checkpointId, leases, seconds: secondsSince(start) };
    },

    /** Release (after publish) or abort (before): the same call; every stage runs even if one fails. */
    async gymResume(input: GymCallInput): Promise<GymResumeOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      const replies = await gymCall({ op: 'resume', checkpointId: input.checkpointId }, (signal) =>
        resume(dep, { checkpointId: input.checkpointId, deadlineTs, ...(signal ? { signal } : {}) }),
      );
      const idempotent = Object.keys(replies)
        .filter((n) => replies[n]!.idempotent)
        .sort();
      return { checkpointId: input.checkpointId, idempotent, seconds: secondsSince(start) };
    },

    /** All or nothing: on failure coordination retires the replacements and resumes before raising. */
    async gymRestore(input: GymRestoreInput): Promise<GymRestoreOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      const parts = Array.isArray(input.scope) ? undefined : input.scope;
      const scope = parts
        ? await readScopeParts(parts.dir, parts.shards).then(
            (r) => r.scope,
            (err: unknown) => {
              throw err instanceof ApplicationFailure ? err : storageFailure(`reading the restore scope in ${parts.dir}`, err);
            },
          )
        : (input.scope as EpisodeId[]);
      const replies = await gymCall({ op: 'restore', checkpointId: input.restoreId }, (signal) =>
        restore(dep, {
          checkpointId: input.restoreId,
          deadlineTs,
          checkpointDir: input.checkpointDir,
          scope,
          log,
          ...(signal ? { signal } : {}),
        }),
      );
      if (input.sourceCheckpointId !== undefined) {
        const wrong = Object.entries(replies)
          .filter(([, r]) => r.source_checkpoint_id !== input.sourceCheckpointId)
          .map(([name, r]) => `${name}: ${JSON.stringify(r.source_checkpoint_id)}`);
        if (wrong.length > 0) {
          throw invariantFailure(`restore ${input.restoreId}: participants restored another checkpoint than ${input.sourceCheckpointId}: ${wrong.join('; ')}`);
        }
      }
      const restored: Record<string, CaptureKey[]> = {};
      for (const [name, r] of Object.entries(replies)) restored[name] = [...r.restored];
      if (!parts) return { restoreId: input.restoreId, restored, seconds: secondsSince(start) };
      // The replacements go to the shards by file; the history carries their count.
      await writeRestored(parts.dir, restored).catch((err: unknown) => {
        throw storageFailure(`writing what the restore installed into ${parts.dir}`, err);
      });
      const counts = Object.fromEntries(Object.entries(restored).map(([name, keys]) => [name, keys.length]));
      return { restoreId: input.restoreId, restored: {}, restoredCounts: counts, scopeCount: scope.length, seconds: secondsSince(start) };
    },

    async gymRetire(input: GymRetireInput): Promise<GymRetireOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      const replies = await gymCall({ op: 'retire', count: input.episodes.length }, (signal) =>
        retire(dep, {
          deadlineTs,
          episodes: input.episodes,
          ...(input.checkpointId !== undefined ? { checkpointId: input.checkpointId } : {}),
          ...(signal ? { signal } : {}),
        }),
      );
      const retired: Record<string, number> = {};
      for (const [name, r] of Object.entries(replies)) retired[name] = r.retired_count;
      return { retired, seconds: secondsSince(start) };
    },

    async gymForget(input: GymForgetInput): Promise<GymForgetOutcome> {
      const start = Date.now();
      const dep = participantsOf(token, deps.controlPool, input.topology);
      const deadlineTs = deadlineIn(input.timeoutS);
      const replies = await gymCall({ op: 'forget', count: input.rolloutIds.length }, (signal) =>
        forget(dep, {
          deadlineTs,
          rolloutIds: input.rolloutIds,
          ...(input.checkpointId !== undefined ? { checkpointId: input.checkpointId } : {}),
          ...(signal ? { signal } : {}),
        }),
      );
      const forgotten: Record<string, number> = {};
      for (const [name, r] of Object.entries(replies)) forgotten[name] = r.forgotten_count;
      return { forgotten, seconds: secondsSince(start) };
    },
  };
}

export type GymActivities = ReturnType<typeof createGymActivities>;
