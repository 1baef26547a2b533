// scale: a checkpoint of N in-flight rollouts on a real Gym deployment, a crash, and a restore.
//
//   npm run bench -- scale [--rollouts 500] [--rollouts 8000 --rollouts 16000]
//                          [--window 256] [--finished-fraction 0.05] [--seed 7] [--keep]
//                          [--shards 1] [--workers 1] [--profile <dir>]
//
// The deployment (launcher, one process per server): tiny-policy inference, the policy model as
// a participant, Simple Agent, weather (stateless) and counter (exported session state)
// resources and their environment servers. N rollouts are POSTed straight to the environment
// servers' `/run` (tasks from activities/dataset.ts; 3 weather : 1 counter), each held at its
// second model call by the backend (`/_ctl/hold {after_calls_per_rollout: 1}`); a few
// (--finished-fraction) answer at their first call and finish before the checkpoint.
// Rollout IDs are picked by replaying the tiny policy offline (sampling is a function of rollout
// ID, call index and policy version), so the expected reward of each rollout is known: every held
// rollout is one the policy solves (reward 1.0).
//
// Then, as a controller would (activities/coordination.ts): discover → prepare → continuedScope →
// commit → resume, each timed (and per participant, from the control calls' round trips);
// SIGKILL every Gym process (the inference backend survives); fresh processes; restore → resume
// (timed); release the hold; redispatch every exported episode as attempt N+1.
// Verified: every rollout either finished before the checkpoint or was exported (or reported as a
// restart), never two of these; every exported one completes after the restore with its expected
// reward (1.0) making only the calls after its saved turn (it continued, it did not start over).
//
// --shards k: k copies of the environment servers, agent and policy model (one backend, one pair
// of resources servers). A held episode keeps a connection open on every hop, so the agent and
// the model need two file descriptors per episode: one copy tops out near ulimit -n / 2 held
// episodes (20,000 here: ~9,900), and the benchmark refuses a size that does not fit.
//
// --workers w: the environment servers, agent and policy model each run as w worker processes
// behind their one URL (docs/multi-worker.md): the front hands each connection to its worker and
// keeps none; each worker holds two descriptors per episode it owns.
//
// --profile <dir>: every Gym process is CPU-profiled (a preload module; NODE_OPTIONS refuses
// --cpu-prof). The first processes write theirs (`<server>-<pid>-first.cpuprofile`, from start to
// just before the crash: the dispatch and the first checkpoint) when the bench sends SIGUSR2, as a
// SIGKILLed process writes nothing. The restored processes' replacements are held again at their
// next call and a second checkpoint is taken and timed (again_*), then everything finishes and the
// processes exit gracefully, so their profiles (`<server>-<pid>.cpuprofile`) cover a restore and a
// checkpoint. `windows.json` holds the monotonic microsecond windows of the first commit, the
// restore and the second prepare/commit, the clock of the profiles' sample times, to cut them.
// Open them in Chrome DevTools or speedscope.
import { setTimeout as sleep } from 'node:timers/promises';
import diagnostics_channel from 'node:diagnostics_channel';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { Agent, type Dispatcher, getGlobalDispatcher, request } from 'undici';
import {
  commit,
  committedEnvironmentKeys,
  continuedScope,
  discover,
  prepare,
  preparedBlockers,
  preparedRestarts,
  restore,
  resume,
  type Participants,
} from '../activities/coordination.js';
import { createControlPool } from '../activities/control-client.js';
import { taskAt } from '../activities/dataset.js';
import { CONTROL_PREFIX } from '../protocol/control.js';
import { captureKey, nextAttempt, type EpisodeId } from '../protocol/ids.js';
import type { ChatMessage } from '../protocol/openai.js';
import type { Task } from '../protocol/tasks.js';
import type { Endpoints } from '../servers/common/deployment.js';
import { decide, initialWeights } from '../servers/inference/policy.js';
import { downDeployment, killDeployment, restartDeployment, statusDeployment, upDeployment } from '../servers/launcher/launcher.js';
import { readRunState } from '../servers/launcher/run-dir.js';
import { CLIENT_KEEP_ALIVE } from '../protocol/keep-alive.js';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';
import { httpJson, type HttpReply } from '../test/helpers/http.js';

export const TOKEN = 'bench-scale-token';
/** The backend's `seed` option: mixed into every sampling seed. */
export const BACKEND_SALT = 1;

/**
 * The deployment of scale (and the controller benchmarks): weather and counter, the model a
 * participant. With `shards` > 1 the servers that hold a connection per running episode (the
 * environment servers, the agent and the policy model) come `shards` times — `<name>_<k>` for
 * k ≥ 2 — in front of the one backend and the one pair of resources servers. `tokenDelayMs`: the
 * backend waits this long per generated token (longer rollouts; 0 = as fast as it can).
 */
export function gymYaml(opts: { checkpoint?: boolean; shards?: number; workers?: number; tokenDelayMs?: number } = {}): string {
  const on = opts.checkpoint ?? true;
  const lines = [
    'checkpoint:',
    `  enabled: ${on}`,
    '  lease_grace_seconds: 600',
    'servers:',
    `  policy_backend: { kind: inference, options: { seed: ${BACKEND_SALT}, token_delay_ms: ${opts.tokenDelayMs ?? 0} } }`,
    '  weather:        { kind: resources, type: weather }',
    '  counter:        { kind: resources, type: counter }',
  ];
  const w = (opts.workers ?? 1) > 1 ? `, workers: ${opts.workers}` : '';
  for (let k = 1; k <= (opts.shards ?? 1); k++) {
    const n = (base: string): string => shardName(base, k);
    lines.push(
      `  ${n('policy_model')}: { kind: model, options: { backend: policy_backend, checkpoint_policy: ${on} }${w} }`,
      `  ${n('simple_agent')}: { kind: agent, options: { model: ${n('policy_model')}, max_steps: 8 }${w} }`,
      `  ${n('weather_env')}: { kind: environment, options: { agent: ${n('simple_agent')}, resources: weather }${w} }`,
      `  ${n('counter_env')}: { kind: environment, options: { agent: ${n('simple_agent')}, resources: counter }${w} }`,
    );
  }
  return `${lines.join('\n')}\n`;
}

/** Server `base` of shard k (1-based): the first shard keeps the plain names. */
export const shardName = (base: string, k: number): string => (k === 1 ? base : `${base}_${k}`);

export const ENVIRONMENT_OF: Readonly<Record<string, string>> = { weather: 'weather_env', counter: 'counter_env', genrm: 'genrm_env' };

// --- the tiny policy, offline -----------------------------------------------------------------

export interface Simulated {
  /** Model calls the episode makes. */
  calls: number;
  /** The reward its verify gives. */
  reward: number;
}

/**
 * Replays the agent loop against the tiny policy (initial weights): sampling reads only the task
 * line and the assistant messages, so this is what the real episode does.
 */
export function simulate(task: Task, rolloutId: string, salt = BACKEND_SALT, maxSteps = 8): Simulated {
  const messages = structuredClone(task.task_input.responses_create_params.input) as ChatMessage[];
  const weights = initialWeights();
  const data = task.task_input.task_data as { city?: string; initial_count?: number; expected_count?: number };
  let count = data.initial_count ?? 0;
  let rightCity = false;
  let calls = 0;
  for (let step = 0; step < maxSteps; step++) {
    const d = decide({ weights, messages, rolloutId, salt });
    calls += 1;
    for (const c of d.message.tool_calls ?? []) {
      const args = JSON.parse(c.function.arguments) as { count?: number; city?: string };
      if (c.function.name === 'increment_counter') count += args.count ?? 0;
      if (c.function.name === 'get_weather' && args.city === data.city) rightCity = true;
    }
    if (d.finishReason === 'stop') break;
    messages.push(d.message);
    for (const c of d.message.tool_calls ?? []) messages.push({ role: 'tool', tool_call_id: c.id, content: 'ok' });
  }
  const reward = task.task_id.taskset === 'counter' ? (count === data.expected_count ? 1 : 0) : rightCity ? 1 : 0;
  return { calls, reward };
}

export interface PlannedRollout {
  episode: EpisodeId;
  environment: string;
  task: Task;
  expected: Simulated;
  /** Answers at its first call: finishes before the checkpoint. */
  oneCall: boolean;
}

/**
 * N rollouts, 3 weather : 1 counter. Rollout `i` gets the first ID `<prefix>-<i>-<j>` whose episode
 * is solved (reward 1.0) in two calls or more; every `1/finishedFraction`-th instead one that
 * answers at once (weather, reward 0).
 */
export function planRollouts(n: number, opts: { seed: number; prefix: string; finishedFraction: number; shards?: number }): PlannedRollout[] {
  const out: PlannedRollout[] = [];
  const every = opts.finishedFraction > 0 ? Math.max(1, Math.round(1 / opts.finishedFraction)) : Infinity;
  for (let i = 0; i < n; i++) {
    const oneCall = (i + 1) % every === 0;
    const taskset = oneCall || i % 4 !== 3 ? 'weather' : 'counter';
    const task = taskAt(opts.seed, i, [taskset]);
    let found: PlannedRollout | undefined;
    for (let j = 0; j < 2_000 && !found; j++) {
      const rollout_id = `${opts.prefix}-${i}-${j}`;
      const sim = simulate(task, rollout_id);
      const ok = oneCall ? sim.calls === 1 : sim.calls >= 2 && sim.reward === 1;
      // By blocks of four (3 weather + 1 counter), so every shard gets both tasksets.
      const environment = shardName(ENVIRONMENT_OF[taskset]!, 1 + (Math.floor(i / 4) % (opts.shards ?? 1)));
      if (ok) found = { episode: { rollout_id, attempt: 0 }, environment, task, expected: sim, oneCall };
    }
    if (!found) throw new Error(`no rollout ID for task ${i} (${taskset}) has the wanted shape`);
    out.push(found);
  }
  return out;
}

// --- HTTP -------------------------------------------------------------------------------------

export type Reply = HttpReply;

/** `/run` lasts as long as its episode is held: a pool without undici's 300 s timeouts. */
export function newRunPool(): Agent {
  return new Agent({ headersTimeout: 0, bodyTimeout: 0, ...CLIENT_KEEP_ALIVE });
}

export function postJson(url: string, body: unknown, dispatcher: Dispatcher = getGlobalDispatcher()): Promise<Reply> {
  return httpJson(dispatcher, 'POST', url, body);
}

/** GET with a few retries on a reset connection (a keep-alive connection the server just closed). */
export async function getJson(url: string): Promise<any> {
  for (let attempt = 1; ; attempt++) {
    try {
      const res = await request(url).catch((err: unknown) => {
        throw Object.assign(new Error(`GET ${url}: ${(err as Error).message}`, { cause: err }), { code: (err as { code?: string }).code });
      });
      const text = await res.body.text();
      if (res.statusCode !== 200) throw new Error(`GET ${url}: HTTP ${res.statusCode} ${text.slice(0, 300)}`);
      return JSON.parse(text);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (attempt >= 5 || (code !== 'ECONNRESET' && code !== 'UND_ERR_SOCKET')) throw err;
      await sleep(100 * attempt);
    }
  }
}

/** The tiny-policy backend's test controls. */
export class Backend {
  constructor(readonly url: string) {}
  async hold(rule: { after_calls_per_rollout: number }): Promise<void> {
    const r = await postJson(`${this.url}/_ctl/hold`, rule);
    if (r.status !== 200) throw new Error(`hold: HTTP ${r.status}`);
  }
  async release(): Promise<number> {
    return (await postJson(`${this.url}/_ctl/release`, {})).body?.released ?? 0;
  }
  async count(): Promise<number> {
    return (await getJson(`${this.url}/_ctl/call_count`)).count as number;
  }
  async calls(): Promise<Array<{ rollout_id: string; attempt: number; capture_key: string; decoded_tokens: number; t: number; returned?: boolean }>> {
    return getJson(`${this.url}/_ctl/calls`);
  }
}

/** Runs at most `n` of the given tasks at once. */
export function limiter(n: number): <T>(task: () => Promise<T>) => Promise<T> {
  let active = 0;
  const queue: Array<() => void> = [];
  return async (task) => {
    if (active >= n) await new Promise<void>((r) => queue.push(r));
    active += 1;
    try {
      return await task();
    } finally {
      active -= 1;
      queue.shift()?.();
    }
  };
}

export { sleep };

/** Polls until `cond` holds; fails naming `what` (and the last progress line) after `timeoutMs`. */
export async function waitUntil(what: string, cond: () => Promise<string | true>, timeoutMs: number, intervalMs = 200): Promise<void> {
  const until = Date.now() + timeoutMs;
  let last = '';
  for (;;) {
    const r = await cond();
    if (r === true) return;
    last = r;
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what} (${last})`);
    await sleep(intervalMs);
  }
}

// --- CPU of processes -------------------------------------------------------------------------

const CLOCK_TICKS = 100;

/**
 * User + system CPU seconds of the live processes of each process group (Linux /proc), by
 * group ID: the launcher and the Temporal dev server start every server as its own group.
 */
export async function groupCpuSeconds(pgids: readonly number[]): Promise<Map<number, number>> {
  const out = new Map<number, number>(pgids.map((g) => [g, 0]));
  for (const { pgrp, seconds } of (await processCpuSeconds(pgids)).values()) out.set(pgrp, out.get(pgrp)! + seconds);
  return out;
}

/** CPU seconds of each process of the given groups (a multi-worker server: its front and its workers), by pid. */
async function processCpuSeconds(pgids: readonly number[]): Promise<Map<number, { pgrp: number; seconds: number; system: number }>> {
  const { readdir, readFile } = await import('node:fs/promises');
  const want = new Set(pgids);
  const out = new Map<number, { pgrp: number; seconds: number; system: number }>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = await readFile(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // exited meanwhile
    }
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // After the command: state, ppid, pgrp (field 5), …, utime (14), stime (15).
    const pgrp = Number(f[2]);
    if (want.has(pgrp)) out.set(Number(entry), { pgrp, seconds: (Number(f[11]) + Number(f[12])) / CLOCK_TICKS, system: Number(f[12]) / CLOCK_TICKS });
  }
  return out;
}

/**
 * The CPU of each process of a multi-worker server over a stage, with its kernel part:
 * `name: front 0.31 (sys 0.12) + workers 0.52 (sys 0.05) 0.49 (sys 0.04)` (the front is the group
 * leader), for the servers with more than one process.
 */
export async function workerCpuSplit(runDir: string): Promise<() => Promise<string[]>> {
  const state = readRunState(runDir);
  const named = Object.entries(state.servers).filter(([, s]) => s.pid);
  const before = await processCpuSeconds(named.map(([, s]) => s.pid!));
  return async () => {
    const after = await processCpuSeconds(named.map(([, s]) => s.pid!));
    const lines: string[] = [];
    for (const [name, s] of named) {
      if (s.kind === 'inference') continue; // its own helper processes, not workers
      const pids = [...after.entries()].filter(([, v]) => v.pgrp === s.pid).map(([pid]) => pid);
      if (pids.length < 2) continue;
      const delta = (pid: number) => {
        const a = after.get(pid)!;
        const b = before.get(pid);
        return `${(a.seconds - (b?.seconds ?? 0)).toFixed(2)} (sys ${(a.system - (b?.system ?? 0)).toFixed(2)})`;
      };
      lines.push(
        `${name}: front ${delta(s.pid!)} + workers ${pids
          .filter((p) => p !== s.pid)
          .map(delta)
          .join(' ')}`,
      );
    }
    return lines;
  };
}

/** CPU seconds of one process group (e.g. the Temporal dev server, started as its own group). */
export async function processGroupCpuSeconds(pgid: number): Promise<number> {
  return (await groupCpuSeconds([pgid])).get(pgid) ?? 0;
}

/** CPU seconds per server between two `gymCpuSeconds` readings. */
function cpuDelta(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(after).map(([name, s]) => [name, s - (before[name] ?? 0)]));
}

/** CPU seconds of every server process (group) of a Gym run dir, by server name. */
export async function gymCpuSeconds(runDir: string): Promise<Record<string, number>> {
  const state = readRunState(runDir);
  const named = Object.entries(state.servers).filter(([, s]) => s.pid);
  const cpu = await groupCpuSeconds(named.map(([, s]) => s.pid!));
  return Object.fromEntries(named.map(([name, s]) => [name, cpu.get(s.pid!) ?? 0]));
}

// --- per-participant timing of control calls ------------------------------------------------------

interface OpenCall {
  origin: string;
  op: string;
  t0: number;
}

/**
 * Round trip of every control call (`/ng-control/v1/checkpoint/<op>`) this process makes, from
 * undici's diagnostics channels: `op` → origin → seconds (the last call of that op to that origin).
 */
export class ControlCallTimer {
  readonly seconds = new Map<string, Map<string, number>>();
  /** Prefixed to the op of every call recorded from now on (`checkpoint`, `restore`). */
  phase = '';
  private open = new WeakMap<object, OpenCall>();
  private onCreate = (m: unknown): void => {
    const req = (m as { request: { origin?: unknown; path?: unknown } }).request;
    const p = String(req.path ?? '');
    if (!p.startsWith(`${CONTROL_PREFIX}/`)) return;
    this.open.set(req, { origin: String(req.origin ?? ''), op: `${this.phase}${p.slice(CONTROL_PREFIX.length + 1)}`, t0: performance.now() });
  };
  private onHeaders = (m: unknown): void => {
    const req = (m as { request: object }).request;
    const o = this.open.get(req);
    if (!o) return;
    this.open.delete(req);
    let byOrigin = this.seconds.get(o.op);
    if (!byOrigin) this.seconds.set(o.op, (byOrigin = new Map()));
    byOrigin.set(o.origin.replace(/\/+$/, ''), (performance.now() - o.t0) / 1000);
  };

  start(): this {
    diagnostics_channel.subscribe('undici:request:create', this.onCreate);
    diagnostics_channel.subscribe('undici:request:headers', this.onHeaders);
    return this;
  }
  stop(): void {
    diagnostics_channel.unsubscribe('undici:request:create', this.onCreate);
    diagnostics_channel.unsubscribe('undici:request:headers', this.onHeaders);
  }
  of(op: string, url: string): number | null {
    return this.seconds.get(op)?.get(url.replace(/\/+$/, '')) ?? null;
  }
}

/**
 * A preload module that profiles its process from start to exit (`--cpu-prof` is not allowed in
 * NODE_OPTIONS, and the launcher starts the servers), and writes what it has on SIGUSR2 (the
 * first processes, which the bench SIGKILLs): written into the bench's temp dir.
 */
export async function writeProfiler(tmp: string, outDir: string): Promise<string> {
  const file = join(tmp, 'cpu-profiler.mjs');
  await writeFile(
    file,
    `import inspector from 'node:inspector';
import { mkdirSync, writeFileSync } from 'node:fs';
const session = new inspector.Session();
session.connect();
session.post('Profiler.enable');
session.post('Profiler.start');
const write = (suffix, profile) => {
  mkdirSync(${JSON.stringify(outDir)}, { recursive: true });
  const name = (process.argv[process.argv.indexOf('--name') + 1] ?? 'node') + '-' + process.pid + suffix;
  writeFileSync(${JSON.stringify(outDir)} + '/' + name + '.cpuprofile', JSON.stringify(profile));
};
process.on('exit', () => {
  // The in-thread session answers synchronously.
  session.post('Profiler.stop', (err, r) => {
    if (!err) write('', r.profile);
  });
});
// The first processes are SIGKILLed by the bench: it asks for their profile before.
process.on('SIGUSR2', () => {
  session.post('Profiler.stop', (err, r) => {
    if (!err) write('-first', r.profile);
    session.post('Profiler.start');
  });
});
`,
  );
  return file;
}

/** Asks every Gym process for its profile so far (SIGUSR2 to each server's process group) and waits for them. */
export async function profilesBeforeKill(runDir: string, outDir: string): Promise<void> {
  const groups = Object.values(readRunState(runDir).servers).filter((s) => s.pid && s.kind !== 'inference');
  const pids = [...(await processCpuSeconds(groups.map((s) => s.pid!))).keys()];
  for (const g of groups) process.kill(-g.pid!, 'SIGUSR2');
  await waitUntil(
    'profiles of the first processes',
    async () => {
      const written = (await readdir(outDir).catch(() => [] as string[])).filter((f) => f.endsWith('-first.cpuprofile')).length;
      return written >= pids.length ? true : `${written}/${pids.length}`;
    },
    60_000,
  );
}

/**
 * A held episode keeps a connection open on every hop (bench → environment → agent → model →
 * backend): the agent and the model hold two descriptors per episode of their shard, the
 * backend one per held episode. Released all at once (the profile path's second checkpoint, as a
 * controller's resume does), every agent episode makes its next tool call while its model
 * connection idles in the pool: three per episode. Past the process limit (`ulimit -n`) accepts
 * and connects fail: refuse up front, naming the way out.
 */
function checkDescriptors(held: number, shards: number, workers: number, releasedAtOnce: boolean): void {
  const limit = Number(/Max open files\s+(\d+)/.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1] ?? Infinity);
  const perEpisode = releasedAtOnce ? 3 : 2;
  // With workers, each worker holds its descriptors of the episodes it owns (the front hands connections over and keeps none).
  const perShard = perEpisode * Math.ceil(held / shards / workers) + 200;
  const need = Math.max(perShard, held + 200);
  if (need > limit) {
    const processes = Math.ceil((perEpisode * held) / (limit - 200));
    throw new Error(
      `${held} held episodes need about ${need} open files in one process (agent, model: ${perEpisode} per episode of their shard or worker; ` +
        `the backend and this process: 1 per episode), over the limit of ${limit} (ulimit -n)` +
        (held + 200 <= limit ? `: run with ${workers > 1 ? `--workers ${Math.ceil(processes / shards)}` : `--shards ${processes}`}` : ': raise ulimit -n'),
    );
  }
}

/** After a failure: which servers are gone, and the end of their logs. */
async function reportDeadServers(runDir: string, log: (line: string) => void): Promise<void> {
  for (const st of await statusDeployment(runDir)) {
    if (st.alive) continue;
    let tail = '';
    try {
      tail = readFileSync(join(runDir, 'logs', `${st.name}.log`), 'utf8')
        .split('\n')
        .slice(-15)
        .join('\n    ');
    } catch {
      tail = '(no log)';
    }
    log(`  ${st.name} (pid ${st.pid}) is not running; its log ends:\n    ${tail}`);
  }
}

// --- one size ---------------------------------------------------------------------------------

interface RunCall {
  planned: PlannedRollout;
  reply?: Reply;
  error?: unknown;
  settledAt?: number;
  done: Promise<void>;
}

function startRun(pool: Agent, endpoints: Endpoints, planned: PlannedRollout, episode: EpisodeId = planned.episode): RunCall {
  const url = `${endpoints[planned.environment]!.url}/run`;
  const st = { planned } as RunCall;
  st.done = postJson(url, { episode_id: episode, task: planned.task }, pool).then(
    (r) => {
      st.reply = r;
      st.settledAt = performance.now();
    },
    (err: unknown) => {
      st.error = err;
      st.settledAt = performance.now();
    },
  );
  return st;
}

/** No new model call for this long while dispatching: something is stuck (see checkDescriptors). */
const STALL_MS = 120_000;

/**
 * Starts `start(item)` for every item with a window on the work not yet done: an item owes
 * `owed(item)` model calls before it is held or finished; at most `window` items' worth of calls
 * (two each) are outstanding, so no server gets thousands of connections at once.
 */
async function dispatchWindowed<T>(
  items: readonly T[],
  start: (item: T) => RunCall,
  owed: (item: T) => number,
  backend: Backend,
  window: number,
): Promise<RunCall[]> {
  const base = await backend.count();
  const out: RunCall[] = [];
  let total = 0;
  let calls = 0;
  let progressAt = Date.now();
  for (const item of items) {
    while (total - calls > 2 * window) {
      await sleep(50);
      const now = (await backend.count()) - base;
      if (now > calls) progressAt = Date.now();
      calls = now;
      const failed = out.find((r) => r.error !== undefined);
      if (failed) throw new Error(`/run of ${captureKey(failed.planned.episode)} failed during dispatch: ${String(failed.error)}`);
      if (Date.now() - progressAt > STALL_MS) {
        throw new Error(`dispatch stalled: no model call for ${STALL_MS / 1000} s after ${out.length} of ${items.length} rollouts (${calls} calls)`);
      }
    }
    out.push(start(item));
    total += owed(item);
  }
  return out;
}

const rewardOf = (r: Reply | undefined): number | null => (r && r.status === 200 && r.body?.result ? (r.body.result.reward as number) : null);

const deadlineIn = (s: number): number => Date.now() / 1000 + s;

/** The reserved control pool; replaced after a crash (its idle connections point at dead servers). */
let controlPool = createControlPool();

async function dropControlPool(): Promise<void> {
  const old = controlPool;
  controlPool = createControlPool();
  await old.destroy();
}

async function participantsOf(endpoints: Endpoints): Promise<Participants> {
  const servers = Object.entries(endpoints)
    .filter(([, e]) => e.kind !== 'inference')
    .map(([name, e]) => ({ name, url: e.url }));
  const found = await discover({ servers, token: TOKEN, pool: controlPool, probeTimeoutMs: 60_000, requireModel: true });
  return { token: TOKEN, pool: controlPool, members: found.members };
}

export interface ScaleOptions {
  rollouts: number;
  window: number;
  finishedFraction: number;
  seed: number;
  keep: boolean;
  /** Copies of the environment servers, agent and policy model (see gymYaml). */
  shards: number;
  /** Worker processes of each environment server, the agent and the policy model (see gymYaml). */
  workers: number;
  /** CPU profiles of the restored Gym processes go here; adds a second checkpoint (see the header). */
  profileDir?: string;
  log: (line: string) => void;
}

interface ScaleResult {
  row: Row;
  participants: Row[];
  problems: string[];
}

async function runScale(o: ScaleOptions): Promise<ScaleResult> {
  const n = o.rollouts;
  const dir = await mkdtemp(join(tmpdir(), `bench-scale-${n}-`));
  const runDir = join(dir, 'gym');
  const checkpointDir = join(dir, 'checkpoint');
  const env = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'error' };
  const problems: string[] = [];
  const timer = new ControlCallTimer().start();
  let pool = newRunPool();
  const t = (ms: number): number => round3(ms / 1000);
  try {
    const tPlan = performance.now();
    const planned = planRollouts(n, { seed: o.seed, prefix: `scale${n}`, finishedFraction: o.finishedFraction, shards: o.shards });
    checkDescriptors(n - planned.filter((p) => p.oneCall).length, o.shards, o.workers, o.profileDir !== undefined);
    const oneCall = planned.filter((p) => p.oneCall).length;
    const expectedCallsAtHold = planned.reduce((s, p) => s + Math.min(2, p.expected.calls), 0);
    o.log(`  planned ${n} rollouts (${oneCall} finish at once) in ${t(performance.now() - tPlan)} s`);

    await writeFile(join(dir, 'gym.yaml'), gymYaml({ shards: o.shards, workers: o.workers }));
    const tUp = performance.now();
    const profileEnv = o.profileDir ? { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${await writeProfiler(dir, o.profileDir)}`.trim() } : {};
    const up = await upDeployment({ config: join(dir, 'gym.yaml'), runDir, env: { ...env, ...profileEnv }, healthTimeoutMs: 180_000 });
    const endpoints = up.endpoints;
    const backend = new Backend(endpoints.policy_backend!.url);
    o.log(`  deployment up in ${t(performance.now() - tUp)} s`);
    await backend.hold({ after_calls_per_rollout: 1 });

    // Dispatch with a window on the work not yet done: a rollout owes up to two model calls
    // before it is held (or finished); at most `window` rollouts' worth of calls outstanding.
    const tDispatch = performance.now();
    const runs = await dispatchWindowed(
      planned,
      (p) => startRun(pool, endpoints, p),
      (p) => Math.min(2, p.expected.calls),
      backend,
      o.window,
    );
    let calls = 0;
    await waitUntil(
      `${n} rollouts held or finished`,
      async () => {
        calls = await backend.count();
        const finished = runs.filter((r) => r.settledAt !== undefined).length;
        const failed = runs.filter((r) => r.settledAt !== undefined && !r.planned.oneCall).length;
        if (failed > 0)
          throw new Error(
            `${failed} held rollouts ended before the checkpoint: ${JSON.stringify(runs.find((r) => r.settledAt !== undefined && !r.planned.oneCall)?.reply ?? String(runs.find((r) => r.error)?.error)).slice(0, 500)}`,
          );
        return calls >= expectedCallsAtHold && finished >= oneCall ? true : `${calls}/${expectedCallsAtHold} model calls, ${finished}/${oneCall} finished`;
      },
      60_000 + n * 100,
    );
    const dispatchS = (performance.now() - tDispatch) / 1000;
    o.log(`  ${n - oneCall} held, ${oneCall} finished after ${round3(dispatchS)} s`);

    // --- checkpoint --------------------------------------------------------------------------
    const id = `bench-scale-${n}`;
    const dep = await participantsOf(endpoints);
    // Profile windows, in the profiles' clock (microseconds).
    const mono = (): number => Number(process.hrtime.bigint() / 1000n);
    const windows: Record<string, [number, number]> = {};
    const t0 = performance.now();
    const prepared = await prepare(dep, { checkpointId: id, deadlineTs: deadlineIn(600) });
    const t1 = performance.now();
    if (!prepared.prepared) throw new Error(`checkpoint did not prepare: ${JSON.stringify(preparedBlockers(prepared)).slice(0, 1000)}`);
    const finishedBefore = new Set(runs.filter((r) => r.settledAt !== undefined).map((r) => captureKey(r.planned.episode)));
    const inFlight = runs.filter((r) => r.settledAt === undefined).map((r) => r.planned.episode);
    const scope = continuedScope(prepared, inFlight);
    const cpuBeforeCommit = await gymCpuSeconds(runDir);
    const commitSplit = await workerCpuSplit(runDir);
    const t2 = performance.now();
    const c0 = mono();
    const commitReplies = await commit(dep, { checkpointId: id, deadlineTs: deadlineIn(600), checkpointDir, scope });
    const t3 = performance.now();
    windows.commit = [c0, mono()];
    const commitCpu = cpuDelta(cpuBeforeCommit, await gymCpuSeconds(runDir));
    for (const line of await commitSplit()) o.log(`  commit CPU s, ${line}`);
    const exported = committedEnvironmentKeys(dep, commitReplies);
    const t4 = performance.now();
    await resume(dep, { checkpointId: id, deadlineTs: deadlineIn(600) });
    const t5 = performance.now();
    const restarts = preparedRestarts(prepared).map(captureKey);
    o.log(`  checkpoint: prepare ${t(t1 - t0)} s, commit ${t(t3 - t2)} s, resume ${t(t5 - t4)} s; ${exported.length} exported, ${restarts.length} restarts`);

    // --- who is where ----------------------------------------------------------------------------
    const exportedSet = new Set(exported);
    const restartSet = new Set(restarts);
    for (const r of runs) {
      const k = captureKey(r.planned.episode);
      const places = [finishedBefore.has(k) && 'finished', exportedSet.has(k) && 'exported', restartSet.has(k) && 'restart'].filter(Boolean);
      if (places.length !== 1) problems.push(`${k}: ${places.length ? places.join(' and ') : 'neither finished, exported nor a restart'}`);
    }
    const dispatched = new Set(runs.map((r) => captureKey(r.planned.episode)));
    for (const k of exported) if (!dispatched.has(k)) problems.push(`${k}: exported but never dispatched`);
    for (const r of runs) {
      if (!r.planned.oneCall || r.settledAt === undefined) continue;
      if (rewardOf(r.reply) !== r.planned.expected.reward)
        problems.push(`${captureKey(r.planned.episode)}: finished with reward ${rewardOf(r.reply)}, expected ${r.planned.expected.reward}`);
    }

    // --- crash, restart, restore ----------------------------------------------------------------
    if (o.profileDir) await profilesBeforeKill(runDir, o.profileDir);
    const tKill = performance.now();
    const killed = await killDeployment(runDir);
    await Promise.all(runs.map((r) => r.done));
    const finishedAfter = runs.filter((r) => !finishedBefore.has(captureKey(r.planned.episode)) && rewardOf(r.reply) !== null).length;
    if (finishedAfter > 0) problems.push(`${finishedAfter} exported rollouts delivered a result between the checkpoint and the crash (they were held)`);
    // Idle keep-alive connections to the dead servers would keep their ports in FIN-WAIT.
    await Promise.all([pool.destroy(), dropControlPool()]);
    pool = newRunPool();
    const tRestart = performance.now();
    await restartDeployment(runDir, { env: { ...env, ...profileEnv }, healthTimeoutMs: 180_000 });
    const tRestarted = performance.now();
    o.log(`  killed ${killed.length} servers; fresh processes healthy in ${t(tRestarted - tRestart)} s`);
    const dep2 = await participantsOf(endpoints);
    timer.phase = 'restore:';
    const restoreId = `bench-restore-${n}`;
    const restoreScope = scope.filter((e) => exportedSet.has(captureKey(e)));
    const cpuBeforeRestore = await gymCpuSeconds(runDir);
    const restoreSplit = await workerCpuSplit(runDir);
    const w0 = mono();
    const r0 = performance.now();
    const restored = await restore(dep2, { checkpointId: restoreId, deadlineTs: deadlineIn(600), checkpointDir, scope: restoreScope });
    const r1 = performance.now();
    windows.restore = [w0, mono()];
    const restoreCpu = cpuDelta(cpuBeforeRestore, await gymCpuSeconds(runDir));
    for (const line of await restoreSplit()) o.log(`  restore CPU s, ${line}`);
    await resume(dep2, { checkpointId: restoreId, deadlineTs: deadlineIn(600) });
    const r2 = performance.now();
    o.log(`  restore ${t(r1 - r0)} s, resume ${t(r2 - r1)} s`);
    const envRestored = new Set(dep2.members.filter((m) => m.kind === 'environment').flatMap((m) => restored[m.name]?.restored ?? []));
    for (const e of restoreScope) {
      const want = captureKey(nextAttempt(e));
      if (!envRestored.has(want)) problems.push(`${want}: not restored by its environment server`);
    }

    // --- redispatch ------------------------------------------------------------------------------
    const callsBefore = await backend.count();
    const byKey = new Map(planned.map((p) => [captureKey(p.episode), p]));
    const again = [...exported, ...restarts].map((k) => byKey.get(k)!).filter(Boolean);
    let reruns: RunCall[] = [];
    let redispatchS: number;
    let second: Row | undefined;
    if (!o.profileDir) {
      await backend.release();
      const tRedispatch = performance.now();
      const slot = limiter(o.window);
      await Promise.all(
        again.map((p) =>
          slot(async () => {
            const st = startRun(pool, endpoints, p, nextAttempt(p.episode));
            reruns.push(st);
            await st.done;
          }),
        ),
      );
      redispatchS = (performance.now() - tRedispatch) / 1000;
    } else {
      await mkdir(o.profileDir, { recursive: true });
      // Profiling: the hold stays, so every replacement is held at its next call; a second
      // checkpoint of the restored processes (whose CPU profiles survive: they exit gracefully).
      const tRedispatch = performance.now();
      reruns = await dispatchWindowed(
        again,
        (p) => startRun(pool, endpoints, p, nextAttempt(p.episode)),
        () => 1,
        backend,
        o.window,
      );
      await waitUntil(
        `${again.length} replacements held`,
        async () => {
          const c = (await backend.count()) - callsBefore;
          return c >= again.length ? true : `${c}/${again.length} calls`;
        },
        60_000 + n * 100,
      );
      const id2 = `bench-scale-${n}-again`;
      const m0 = mono();
      const q0 = performance.now();
      const prepared2 = await prepare(dep2, { checkpointId: id2, deadlineTs: deadlineIn(600) });
      const q1 = performance.now();
      const m1 = mono();
      windows.again_prepare = [m0, m1];
      if (!prepared2.prepared) throw new Error(`second checkpoint did not prepare: ${JSON.stringify(preparedBlockers(prepared2)).slice(0, 1000)}`);
      const scope2 = continuedScope(
        prepared2,
        again.map((p) => nextAttempt(p.episode)),
      );
      const replies2 = await commit(dep2, { checkpointId: id2, deadlineTs: deadlineIn(600), checkpointDir: `${checkpointDir}-again`, scope: scope2 });
      const q2 = performance.now();
      windows.again_commit = [m1, mono()];
      await writeFile(join(o.profileDir, 'windows.json'), `${JSON.stringify(windows)}\n`);
      await resume(dep2, { checkpointId: id2, deadlineTs: deadlineIn(600) });
      const q3 = performance.now();
      second = { prepare_s: t(q1 - q0), commit_s: t(q2 - q1), resume_s: t(q3 - q2), exported: committedEnvironmentKeys(dep2, replies2).length };
      o.log(`  second checkpoint (profiled processes): prepare ${second.prepare_s} s, commit ${second.commit_s} s, resume ${second.resume_s} s`);
      await backend.release();
      await Promise.all(reruns.map((r) => r.done));
      redispatchS = (performance.now() - tRedispatch) / 1000;
    }
    let rewarded = 0;
    for (const r of reruns) {
      const got = rewardOf(r.reply);
      if (got === r.planned.expected.reward) rewarded += 1;
      else
        problems.push(
          `${captureKey(nextAttempt(r.planned.episode))}: reward ${got}, expected ${r.planned.expected.reward} (${r.reply ? `HTTP ${r.reply.status} ${JSON.stringify(r.reply.body).slice(0, 300)}` : String(r.error)})`,
        );
    }
    // A continued episode makes only the calls after its saved turn (here: all but its first).
    const after = (await backend.calls()).slice(callsBefore);
    const callsOf = new Map<string, number>();
    for (const c of after) callsOf.set(c.rollout_id, (callsOf.get(c.rollout_id) ?? 0) + 1);
    let continued = 0;
    for (const k of exported) {
      const p = byKey.get(k);
      if (!p) continue;
      const got = callsOf.get(p.episode.rollout_id) ?? 0;
      if (got === p.expected.calls - 1) continued += 1;
      else problems.push(`${k}: ${got} model calls after the restore, expected ${p.expected.calls - 1} (continued from its saved turn)`);
    }
    o.log(`  redispatched ${again.length} in ${round3(redispatchS)} s: ${rewarded} with the expected reward, ${continued} continued from their saved turn`);

    const members = [...dep.members];
    const participants: Row[] = members.map((m) => {
      const prep = prepared.replies[m.name];
      const man = commitReplies[m.name]?.manifest;
      return {
        rollouts: n,
        server: m.name,
        kind: m.kind,
        prepare_s: round3(timer.of('prepare', m.url) ?? NaN),
        commit_s: round3(timer.of('commit', m.url) ?? NaN),
        resume_s: round3(timer.of('resume', m.url) ?? NaN),
        restore_s: round3(timer.of('restore:restore', m.url) ?? NaN),
        restore_resume_s: round3(timer.of('restore:resume', m.url) ?? NaN),
        // CPU the server's process group used while the stage ran (all servers share the cores).
        commit_cpu_s: round3(commitCpu[m.name] ?? NaN),
        restore_cpu_s: round3(restoreCpu[m.name] ?? NaN),
        records: man?.record_count ?? null,
        counts: prep
          ? Object.entries(prep.report.counts)
              .map(([k, v]) => `${k}=${v}`)
              .join(' ')
          : '',
      };
    });
    const row: Row = {
      rollouts: n,
      shards: o.shards,
      workers: o.workers,
      held: n - oneCall,
      finished_before: finishedBefore.size,
      exported: exported.length,
      restarts: restarts.length,
      dispatch_s: round3(dispatchS),
      prepare_s: t(t1 - t0),
      commit_s: t(t3 - t2),
      resume_s: t(t5 - t4),
      kill_restart_s: t(tRestarted - tKill),
      restore_s: t(r1 - r0),
      restore_resume_s: t(r2 - r1),
      redispatch_s: round3(redispatchS),
      rewarded: rewarded,
      continued,
      problems: problems.length,
      ...(second ? { again_prepare_s: second.prepare_s, again_commit_s: second.commit_s, again_resume_s: second.resume_s } : {}),
    };
    // Graceful: a profiled process writes its profile when it exits.
    await downDeployment(runDir, { graceMs: o.profileDir ? 60_000 : 5_000 });
    if (o.profileDir) o.log(`  CPU profiles of the restored processes in ${o.profileDir}`);
    return { row, participants, problems };
  } catch (err) {
    await reportDeadServers(runDir, o.log).catch(() => undefined);
    await downDeployment(runDir, { graceMs: 2_000 }).catch(() => undefined);
    throw err;
  } finally {
    timer.stop();
    await Promise.all([pool.destroy(), dropControlPool()]);
    if (o.keep) o.log(`  kept ${dir}`);
    else await rm(dir, { recursive: true, force: true });
  }
}

/** Problems counted by cause: a failed rollout's `failure_reason` (else the text after the key), addresses and numbers blanked. */
export function problemCauses(problems: readonly string[]): Array<[string, number]> {
  const counts = new Map<string, number>();
  for (const p of problems) {
    const m = /"failure_reason":"((?:[^"\\]|\\.)*)/.exec(p);
    let reason = p.slice(p.indexOf(': ') + 2);
    if (m) {
      try {
        reason = JSON.parse(`"${m[1]}"`) as string;
      } catch {
        reason = m[1]!; // cut short by the problem's own truncation
      }
    }
    const cause = reason
      .replace(/https?:\/\/[^/\s]+/g, 'http://…')
      .replace(/\d+/g, 'N')
      .slice(0, 200);
    counts.set(cause, (counts.get(cause) ?? 0) + 1);
  }
  return [...counts].sort((a, b) => b[1] - a[1]);
}

// --- main -------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rollouts: { type: 'string', multiple: true, default: ['500'] },
      window: { type: 'string', default: '256' },
      'finished-fraction': { type: 'string', default: '0.05' },
      seed: { type: 'string', default: '7' },
      keep: { type: 'boolean', default: false },
      profile: { type: 'string' },
      shards: { type: 'string', default: '1' },
      workers: { type: 'string', default: '1' },
    },
  });
  const rows: Row[] = [];
  const participantRows: Row[] = [];
  let failed = false;
  for (const n of values.rollouts!.map(Number)) {
    if (!Number.isSafeInteger(n) || n < 1) throw new Error(`--rollouts needs a positive integer, got ${n}`);
    console.log(`scale: ${n} rollouts`);
    const r = await runScale({
      rollouts: n,
      window: Number(values.window),
      finishedFraction: Number(values['finished-fraction']),
      seed: Number(values.seed),
      keep: values.keep!,
      shards: Math.max(1, Number(values.shards)),
      workers: Math.max(1, Number(values.workers)),
      ...(values.profile ? { profileDir: resolve(values.profile) } : {}),
      log: (l) => console.log(l),
    });
    rows.push(r.row);
    participantRows.push(...r.participants);
    if (r.problems.length) {
      failed = true;
      console.log(`  ${r.problems.length} problems, first ones:\n    ${r.problems.slice(0, 20).join('\n    ')}`);
      console.log(
        `  by cause:\n${problemCauses(r.problems)
          .map(([cause, n]) => `    ${String(n).padStart(6)}  ${cause}`)
          .join('\n')}`,
      );
    }
  }
  console.log('');
  printTable(rows);
  console.log('\nper participant (round trip of its control call):');
  printTable(participantRows);
  const last = rows[rows.length - 1]!;
  // Sharded deployments are another configuration: kept apart from the single copy's result.
  const shards = Number(last.shards);
  const workers = Number(last.workers);
  const file = writeBenchResult(
    shards > 1 ? `scale-shards-${shards}` : workers > 1 ? `scale-workers-${workers}` : 'scale',
    {
      rollouts: Number(last.rollouts),
      exported: Number(last.exported),
      prepare_s: Number(last.prepare_s),
      commit_s: Number(last.commit_s),
      restore_s: Number(last.restore_s),
      resume_s: Number(last.resume_s),
    },
    [...rows, ...participantRows.map((p) => ({ table: 'participant', ...p }))],
  );
  console.log(`\nwrote ${file}`);
  if (failed) {
    console.error('scale: verification failed (see problems above)');
    process.exit(1);
  }
  process.exit(0);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
