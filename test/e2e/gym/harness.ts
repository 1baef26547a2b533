// Shared pieces of the process-level Gym e2e suite (participants.md §6.4, §7): bring a deployment
// up with the launcher, crash it (SIGKILL of every Gym process group; the inference backend
// survives), restore it into fresh processes through the coordination client, drive episodes
// with `/run`, and read the backend's call log to assert the exact model calls.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Agent } from 'undici';
import { parse as parseYaml } from 'yaml';
import {
  commit,
  committedEnvironmentKeys,
  continuedScope,
  discover,
  forget,
  prepare,
  preparedBlockers,
  restore,
  resume,
  type Participants,
  type PrepareResult,
} from '../../../activities/coordination.js';
import { createControlPool } from '../../../activities/control-client.js';
import { generateTasks } from '../../../activities/dataset.js';
import { CONTROL_PREFIX, type CommitReply, type RestoreReply } from '../../../protocol/control.js';
import { captureKey, type EpisodeId } from '../../../protocol/ids.js';
import type { ChatMessage } from '../../../protocol/openai.js';
import type { Task } from '../../../protocol/tasks.js';
import type { Endpoints } from '../../../servers/common/deployment.js';
import { decide, initialWeights } from '../../../servers/inference/policy.js';
import { downDeployment, killDeployment, restartDeployment, upDeployment } from '../../../servers/launcher/launcher.js';
import type { CallRecord } from '../../../servers/inference/call-log.js';
import { sleep, waitFor } from '../../helpers/wait.js';
import { type HttpReply, httpJson } from '../../helpers/http.js';

export type { HttpReply };

export const TOKEN = 'gym-e2e-token';
// Every deferred-restore file goes through the records workers (the counter's are tiny), so the
// workers start and serve in real server processes here.
const ENV = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn', NG_RECORDS_DEFER_MIN_BYTES: '0' };
const DEPLOYMENTS = fileURLToPath(new URL('./deployments/', import.meta.url));

// --- waiting ---------------------------------------------------------------------------------

/** Epoch seconds `s` from now (control-plane deadlines). */
export const deadline = (s = 20): number => Date.now() / 1000 + s;

// --- HTTP ------------------------------------------------------------------------------------

// `/run` can take as long as an episode parks: no undici timeouts.
const newPool = (): Agent => new Agent({ headersTimeout: 0, bodyTimeout: 0, connections: 64 });
let runPool = newPool();
let controlPool = createControlPool();

/**
 * Drops every client connection of this process (data and control pools). After a crash, idle
 * keep-alive connections to the dead servers keep their ports in FIN-WAIT until closed here.
 */
export async function dropConnections(): Promise<void> {
  const old = [runPool, controlPool];
  runPool = newPool();
  controlPool = createControlPool();
  await Promise.all(old.map((p) => p.destroy()));
}

export const http = (method: 'GET' | 'POST', url: string, body?: unknown, headers?: Record<string, string>): Promise<HttpReply> =>
  httpJson(runPool, method, url, body, headers);

// --- the inference backend -------------------------------------------------------------------

/** The backend's call log entry (`GET /_ctl/calls`). */
export type { CallRecord } from '../../../servers/inference/call-log.js';

/** The test controls of the tiny-policy backend (`/_ctl/*`). */
export class Backend {
  constructor(readonly url: string) {}

  async hold(rule: { after_calls: number } | { after_calls_per_rollout: number }): Promise<void> {
    expectOk(await http('POST', `${this.url}/_ctl/hold`, rule), 'hold');
  }
  async release(): Promise<number> {
    const r = expectOk(await http('POST', `${this.url}/_ctl/release`, {}), 'release');
    return r.body.released as number;
  }
  /** Clears the hold and the call log (and the per-rollout counts holds use). */
  async reset(): Promise<void> {
    expectOk(await http('POST', `${this.url}/_ctl/reset`, {}), 'reset');
  }
  async calls(): Promise<CallRecord[]> {
    return expectOk(await http('GET', `${this.url}/_ctl/calls`), 'calls').body as CallRecord[];
  }
  async count(): Promise<number> {
    return expectOk(await http('GET', `${this.url}/_ctl/call_count`), 'call_count').body.count as number;
  }
  /** Waits until exactly `n` calls arrived (more is a failure: a call the test did not expect). */
  async waitForCalls(n: number, timeoutMs?: number): Promise<void> {
    await waitFor(
      `${n} model calls`,
      async () => {
        const c = await this.count();
        if (c > n) throw new Error(`expected ${n} model calls, got ${c}: ${JSON.stringify(await this.calls())}`);
        return c === n;
      },
      { timeoutMs },
    );
  }
  /** Waits until the calls of `rollout` all returned (no call of it held or generating). */
  async waitReturned(rollout: string, n: number): Promise<void> {
    await waitFor(`${n} returned calls of ${rollout}`, async () => (await this.calls()).filter((c) => c.rollout_id === rollout && c.returned).length === n);
  }
}

function expectOk(r: HttpReply, what: string): HttpReply {
  if (r.status !== 200) throw new Error(`backend ${what} answered HTTP ${r.status}: ${JSON.stringify(r.body)}`);
  return r;
}

/** The `n_messages` of the calls (of one rollout, every attempt), in arrival order. */
export const nMessages = (calls: readonly CallRecord[], rollout?: string): number[] =>
  calls.filter((c) => rollout === undefined || c.rollout_id === rollout).map((c) => c.n_messages);

// --- the deployment ----------------------------------------------------------------------------

export interface Gym {
  name: string;
  tmp: string;
  runDir: string;
  endpoints: Endpoints;
  backend: Backend;
  /** `seed` of the inference backend (mixed into every sampling seed). */
  salt: number | undefined;
  url(server: string): string;
}

/** Brings up `deployments/<name>.yaml` in a fresh temp dir (free ports picked by the launcher). */
export async function bringUp(name: string): Promise<Gym> {
  const config = join(DEPLOYMENTS, `${name}.yaml`);
  const tmp = mkdtempSync(join(tmpdir(), `gym-e2e-${name}-`));
  const runDir = join(tmp, 'run');
  const gym: Gym = {
    name,
    tmp,
    runDir,
    endpoints: {},
    backend: new Backend(''),
    salt: saltOf(config),
    url(server) {
      const ep = this.endpoints[server];
      if (!ep) throw new Error(`no server '${server}' in ${name}.yaml`);
      return ep.url;
    },
  };
  try {
    const up = await upDeployment({ config, runDir, env: ENV, healthTimeoutMs: 60_000 });
    gym.endpoints = up.endpoints;
  } catch (err) {
    await tearDown(gym);
    throw err;
  }
  const inference = Object.entries(gym.endpoints).find(([, e]) => e.kind === 'inference');
  gym.backend = new Backend(inference![1].url);
  return gym;
}

function saltOf(config: string): number | undefined {
  const doc = parseYaml(readFileSync(config, 'utf8')) as { servers: Record<string, { kind: string; options?: { seed?: number } }> };
  return Object.values(doc.servers).find((s) => s.kind === 'inference')?.options?.seed;
}

/** Stops every process of the deployment (also after a failed bring-up) and removes its files. */
export async function tearDown(gym: Gym | undefined): Promise<void> {
  if (!gym) return;
  try {
    await downDeployment(gym.runDir, { graceMs: 2_000 });
  } catch {
    /* nothing was started */
  }
  // GYM_E2E_KEEP=1 keeps the run dir (server logs under run/logs/) for a post-mortem.
  if (process.env.GYM_E2E_KEEP === '1') console.warn(`kept ${gym.tmp}`);
  else rmSync(gym.tmp, { recursive: true, force: true });
  await dropConnections();
}

/** A crash: SIGKILL every Gym process group; the inference backend keeps running. */
export async function crash(gym: Gym, runs: readonly RunHandle[] = []): Promise<void> {
  await killDeployment(gym.runDir);
  // Their connections died with the environment server.
  await Promise.all(runs.map((r) => r.done));
  await dropConnections();
}

/** Fresh Gym processes on the same ports. */
export async function restart(gym: Gym): Promise<void> {
  await restartDeployment(gym.runDir, { env: ENV, healthTimeoutMs: 60_000 });
}

/**
 * The checkpoint participants, discovered as a controller does (§11.1); the inference backend is
 * not part of Gym. Every deployment here runs the policy model as a participant (checkpoint_policy).
 */
export async function participants(gym: Gym, opts: { exclude?: readonly string[] } = {}): Promise<Participants> {
  const servers = Object.entries(gym.endpoints)
    .filter(([name, e]) => e.kind !== 'inference' && !opts.exclude?.includes(name))
    .map(([name, e]) => ({ name, url: e.url }));
  const found = await discover({ servers, token: TOKEN, pool: controlPool, probeTimeoutMs: 5_000, requireModel: true });
  return { token: TOKEN, pool: controlPool, members: found.members };
}

/**
 * The rollouts are finished for good: forget them everywhere (a restore fences the crashed attempt
 * and a retire its attempts until then; the environment drops their kept `/run` replies).
 */
export async function forgetRollouts(gym: Gym, rolloutIds: readonly string[]): Promise<void> {
  await forget(await participants(gym), { deadlineTs: deadline(), rolloutIds: [...rolloutIds] });
}

/** A directory for one checkpoint, inside the deployment's temp dir. */
export function checkpointDir(gym: Gym, id: string): string {
  return join(gym.tmp, 'checkpoints', id);
}

// --- status ---------------------------------------------------------------------------------------

export interface Status {
  kind: string;
  phase: string;
  retired_rollouts: number;
  report: { ready: boolean; blockers: string[]; counts: Record<string, number>; restarts: string[] };
  [extra: string]: unknown;
}

export async function status(gym: Gym, server: string): Promise<Status> {
  const r = await http('GET', `${gym.url(server)}${CONTROL_PREFIX}/status`, undefined, { authorization: `Bearer ${TOKEN}` });
  if (r.status !== 200) throw new Error(`status of ${server}: HTTP ${r.status} ${JSON.stringify(r.body)}`);
  return r.body as Status;
}

/** Status of every participant, by server name. */
export async function statuses(gym: Gym): Promise<Record<string, Status>> {
  const dep = await participants(gym);
  const out: Record<string, Status> = {};
  for (const m of dep.members) out[m.name] = await status(gym, m.name);
  return out;
}

/**
 * Between tests: clears the backend (hold, call log) and, when an earlier test failed half-way
 * (a checkpoint left open, an episode still live), replaces the Gym processes with fresh ones so
 * the next test starts clean.
 */
export async function cleanSlate(gym: Gym): Promise<void> {
  await gym.backend.reset();
  const live = ['episodes', 'sessions', 'at_boundary', 'inflight', 'held'];
  const dirty = Object.entries(await statuses(gym)).filter(([, s]) => s.phase !== 'idle' || live.some((k) => (s.report.counts[k] ?? 0) !== 0));
  if (dirty.length === 0) return;
  console.warn(`fresh Gym processes: an earlier test left ${dirty.map(([n, st]) => `${n} (${st.phase}, ${JSON.stringify(st.report.counts)})`).join(', ')}`);
  await crash(gym);
  await restart(gym);
  await gym.backend.reset();
}

// --- episodes -------------------------------------------------------------------------------------

export interface RunHandle {
  key: string;
  episode: EpisodeId;
  /** Settles once the `/run` call ended either way; never rejects. */
  done: Promise<void>;
  reply?: HttpReply;
  error?: unknown;
  readonly settled: boolean;
}

/** POSTs `/run` `{episode_id, task}` to an environment server without waiting for the reply. */
export function startRun(gym: Gym, env: string, episode: EpisodeId, task: Task): RunHandle {
  const h = { key: captureKey(episode), episode, settled: false } as RunHandle & { settled: boolean };
  h.done = http('POST', `${gym.url(env)}/run`, { episode_id: episode, task }).then(
    (r) => {
      h.reply = r;
      h.settled = true;
    },
    (err: unknown) => {
      h.error = err;
      h.settled = true;
    },
  );
  return h;
}

/** The `/run` reply of a finished handle (fails on a transport error). */
export async function replyOf(h: RunHandle, timeoutMs = 30_000): Promise<HttpReply> {
  await Promise.race([h.done, sleep(timeoutMs).then(() => Promise.reject(new Error(`/run of ${h.key} did not reply within ${timeoutMs} ms`)))]);
  if (!h.reply) throw new Error(`/run of ${h.key} failed: ${String(h.error)}`);
  return h.reply;
}

/**
 * A crashed attempt delivered no result: its connection died, or (the process groups die one by
 * one) the environment outlived a peer by a moment and replied with a failure.
 */
export function deliveredNoResult(h: RunHandle): boolean {
  return h.settled && (h.reply === undefined || !h.reply.body?.result);
}

/** Runs one episode to its end and returns the `/run` reply. */
export async function runEpisode(gym: Gym, env: string, episode: EpisodeId, task: Task): Promise<HttpReply> {
  return replyOf(startRun(gym, env, episode, task));
}

/** The reward of a successful `/run` reply (fails on anything else). */
export function rewardOf(r: HttpReply): number {
  if (r.status !== 200 || !r.body?.result) throw new Error(`/run did not succeed: HTTP ${r.status} ${JSON.stringify(r.body).slice(0, 800)}`);
  return r.body.result.reward as number;
}

export const episode = (rollout_id: string, attempt = 0): EpisodeId => ({ rollout_id, attempt });

export interface Baseline {
  reward: number;
  /** The uncrashed run's calls: `n_messages` in order, and the full records. */
  nMessages: number[];
  calls: CallRecord[];
  reply: HttpReply;
}

/**
 * A no-crash run of `task` as attempt 0 of `rollout` (sampling is deterministic per rollout ID, so
 * this is what a crashed run must reproduce); then the rollout is forgotten (the environment drops
 * the kept reply) and the backend reset, so the scenario can run the same attempt again.
 */
export async function baseline(gym: Gym, env: string, rollout: string, task: Task): Promise<Baseline> {
  await gym.backend.reset();
  const reply = await runEpisode(gym, env, episode(rollout), task);
  const reward = rewardOf(reply);
  const calls = await gym.backend.calls();
  await forgetRollouts(gym, [rollout]);
  await gym.backend.reset();
  return { reward, nMessages: nMessages(calls), calls, reply };
}

// --- checkpoints ----------------------------------------------------------------------------------

export interface Committed {
  dir: string;
  prepared: PrepareResult;
  scope: EpisodeId[];
  replies: Record<string, CommitReply>;
  /** The environment servers' committed capture keys. */
  environmentKeys: string[];
}

/**
 * Prepare (must prepare) and commit with the controller's scope (`episodes` filtered through
 * `continuedScope`). The checkpoint stays open: the caller resumes it or crashes.
 */
export async function prepareAndCommit(gym: Gym, id: string, episodes: readonly EpisodeId[], opts: { deadlineS?: number } = {}): Promise<Committed> {
  const dep = await participants(gym);
  const prepared = await prepare(dep, { checkpointId: id, deadlineTs: deadline(opts.deadlineS ?? 20) });
  if (!prepared.prepared) throw new Error(`checkpoint ${id} did not prepare: ${JSON.stringify(preparedBlockers(prepared))}`);
  const scope = continuedScope(prepared, episodes);
  const dir = checkpointDir(gym, id);
  const replies = await commit(dep, { checkpointId: id, deadlineTs: deadline(), checkpointDir: dir, scope });
  return { dir, prepared, scope, replies, environmentKeys: committedEnvironmentKeys(dep, replies) };
}

export async function resumeAll(gym: Gym, id: string): Promise<void> {
  await resume(await participants(gym), { checkpointId: id, deadlineTs: deadline() });
}

export interface RestoreOptions {
  dir: string;
  /** The checkpointed attempts N to continue. */
  scope: EpisodeId[];
  restoreId: string;
  /** Servers left out of the restore (negative controls): they come up empty. */
  exclude?: readonly string[];
  /** Runs after the restore and before the resume (e.g. retire restart episodes). */
  beforeResume?: (dep: Participants) => Promise<void>;
}

/**
 * Crash and restore: SIGKILL every Gym process, clear the backend's hold (the held call died with
 * its caller), fresh processes, then restore + resume through the coordination client.
 */
export async function crashAndRestore(gym: Gym, runs: readonly RunHandle[], opts: RestoreOptions): Promise<Record<string, RestoreReply>> {
  await crash(gym, runs);
  await gym.backend.release();
  return restoreInto(gym, opts);
}

/** Restore + resume into the running (fresh) processes. */
export async function restoreInto(gym: Gym, opts: RestoreOptions): Promise<Record<string, RestoreReply>> {
  await restart(gym);
  const dep = await participants(gym, { exclude: opts.exclude });
  const replies = await restore(dep, { checkpointId: opts.restoreId, deadlineTs: deadline(), checkpointDir: opts.dir, scope: opts.scope });
  await opts.beforeResume?.(dep);
  await resume(dep, { checkpointId: opts.restoreId, deadlineTs: deadline() });
  return replies;
}

/** The records one participant wrote into a checkpoint. */
export function readRecords(dir: string, kind: string, instance: string): Array<Record<string, any>> {
  const pdir = join(dir, 'gym', kind, instance);
  const manifest = JSON.parse(readFileSync(join(pdir, 'manifest.json'), 'utf8')) as { records_file: string };
  const file = readdirSync(pdir).find((f) => f === manifest.records_file)!;
  return readFileSync(join(pdir, file), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, any>);
}

// --- choosing rollouts by the tiny policy -----------------------------------------------------------

export interface SimulatedCall {
  situation: string;
  action: string;
  /** Function calls the reply made (name, parsed arguments). */
  toolCalls: Array<{ name: string; args: Record<string, unknown> }>;
}

/**
 * The calls the tiny policy (initial weights) makes for `task` under `rolloutId`: sampling reads
 * only the task line and the assistant/tool messages, so this replays the agent's loop offline.
 * Used to pick rollout IDs whose episodes have the shape a scenario needs; every scenario still
 * takes its expected calls from a real no-crash run.
 */
export function simulate(task: Task, rolloutId: string, salt: number | undefined, maxSteps = 8): SimulatedCall[] {
  const messages = structuredClone(task.task_input.responses_create_params.input) as ChatMessage[];
  const out: SimulatedCall[] = [];
  const weights = initialWeights();
  for (let step = 0; step < maxSteps; step++) {
    const d = decide({ weights, messages, rolloutId, salt });
    const toolCalls = (d.message.tool_calls ?? []).map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) as Record<string, unknown> }));
    out.push({ situation: d.situation, action: d.action, toolCalls });
    if (d.finishReason === 'stop') break;
    messages.push(d.message);
    for (const c of d.message.tool_calls ?? []) messages.push({ role: 'tool', tool_call_id: c.id, content: 'ok' });
  }
  return out;
}

/** The first `<prefix>-<i>` whose simulated calls satisfy `want`. */
export function pickRollout(task: Task, prefix: string, salt: number | undefined, want: (calls: SimulatedCall[]) => boolean): string {
  for (let i = 0; i < 10_000; i++) {
    const id = `${prefix}-${i}`;
    if (want(simulate(task, id, salt))) return id;
  }
  throw new Error(`no rollout ID with prefix ${prefix} gives the wanted episode`);
}

/** weather: the right city first, then an answer — reward 1.0 in two calls. */
export const weatherSolved =
  (task: Task) =>
  (calls: SimulatedCall[]): boolean =>
    calls.length === 2 && calls[0]!.action === 'call_right_city' && calls[1]!.action === 'answer' && !!task;

/** counter: increments that sum to `target - start` and then an answer (reward 1.0), `minIncrements` at least. */
export const counterSolved =
  (task: Task, minIncrements: number) =>
  (calls: SimulatedCall[]): boolean => {
    const data = task.task_input.task_data as { initial_count: number; expected_count: number };
    const incs = calls.flatMap((c) => c.toolCalls.filter((t) => t.name === 'increment_counter').map((t) => t.args.count as number));
    const last = calls[calls.length - 1];
    return last?.action === 'answer' && incs.length >= minIncrements && data.initial_count + incs.reduce((a, b) => a + b, 0) === data.expected_count;
  };

/**
 * A counter task and rollout the tiny policy solves (reward 1.0) with at least two increments,
 * tried in order over the dataset; the no-crash baseline of each scenario confirms the choice.
 */
export function solvedCounter(gym: Gym, prefix: string): { task: Task; rollout: string } {
  for (const task of generateTasks({ seed: 11, count: 40, tasksets: ['counter'] })) {
    for (let i = 0; i < 50; i++) {
      const rollout = `${prefix}-${i}`;
      if (counterSolved(task, 2)(simulate(task, rollout, gym.salt))) return { task, rollout };
    }
  }
  throw new Error('no counter task the tiny policy solves');
}
