// Process-level harness for the policy model participant's e2e scenarios: a Gym deployment whose
// policy model server has `checkpoint_policy: true` (optionally generation cuts), brought up with
// the launcher, checkpointed and restored through the coordination client (discovery requires the
// model participant), crashed with SIGKILL (the inference backend survives), with the backend's
// test controls and the model server's capture directory (the default, under the run dir) at hand.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent } from 'undici';
import {
  commit,
  continuedScope,
  discover,
  prepare,
  preparedBlockers,
  restore,
  resume,
  type Participants,
  type PrepareResult,
} from '../../../activities/coordination.js';
import { createControlPool } from '../../../activities/control-client.js';
import { CONTROL_PREFIX, type CommitReply } from '../../../protocol/control.js';
import { captureKey, type EpisodeId } from '../../../protocol/ids.js';
import type { Task } from '../../../protocol/tasks.js';
import type { Endpoints } from '../../../servers/common/deployment.js';
import { initialWeights, type PolicyWeights } from '../../../servers/inference/policy.js';
import { downDeployment, killDeployment, restartDeployment, upDeployment } from '../../../servers/launcher/launcher.js';
import { ledgerPath } from '../../../servers/model/capture-ledger.js';
import { tokensDir } from '../../../servers/model/token-store.js';
import type { CallRecord } from '../../../servers/inference/call-log.js';
import { sleep, waitFor } from '../../helpers/wait.js';
import { type HttpReply, httpJson } from '../../helpers/http.js';

export type { HttpReply };

export const TOKEN = 'model-e2e-token';
const ENV = { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' };

export const deadline = (s = 20): number => Date.now() / 1000 + s;
export const episode = (rollout_id: string, attempt = 0): EpisodeId => ({ rollout_id, attempt });

// --- HTTP ----------------------------------------------------------------------------------------

const pool = new Agent({ headersTimeout: 0, bodyTimeout: 0, connections: 64 });

export const http = (method: 'GET' | 'POST', url: string, body?: unknown, headers?: Record<string, string>): Promise<HttpReply> =>
  httpJson(pool, method, url, body, headers);

export async function closeHttp(): Promise<void> {
  await pool.close();
}

// --- the deployment -----------------------------------------------------------------------------

/** Decisive weights: weather calls the right city once, then answers; counter counts up by one, then answers. */
export function decisiveWeights(): PolicyWeights {
  const w = initialWeights();
  w.logits['weather:calls=0'] = { call_right_city: 30, call_wrong_city: 0, answer: 0 };
  w.logits['weather:calls=1'] = { call_right_city: 0, call_wrong_city: 0, answer: 30 };
  w.logits['weather:calls=2+'] = { call_right_city: 0, call_wrong_city: 0, answer: 30 };
  for (let r = 1; r <= 6; r++) w.logits[`counter:remaining=${r}`] = { inc1: 30, inc2: 0, inc3: 0, answer: 0 };
  for (let r = -3; r <= 0; r++) w.logits[`counter:remaining=${r}`] = { inc1: 0, inc2: 0, inc3: 0, answer: 30 };
  return w;
}

export interface GymOptions {
  topology: 'weather' | 'counter';
  cuts?: boolean;
  tokenDelayMs?: number;
}

/** The backend's call log entry (`GET /_ctl/calls`). */
export type { CallRecord } from '../../../servers/inference/call-log.js';

export class Backend {
  constructor(readonly url: string) {}
  async hold(rule: { after_calls: number } | { after_calls_per_rollout: number }): Promise<void> {
    expectOk(await http('POST', `${this.url}/_ctl/hold`, rule), 'hold');
  }
  async release(): Promise<void> {
    expectOk(await http('POST', `${this.url}/_ctl/release`, {}), 'release');
  }
  async calls(): Promise<CallRecord[]> {
    return expectOk(await http('GET', `${this.url}/_ctl/calls`), 'calls').body as CallRecord[];
  }
  async cuts(): Promise<string[][]> {
    return expectOk(await http('GET', `${this.url}/_ctl/cuts`), 'cuts').body as string[][];
  }
  async waitForCalls(n: number): Promise<CallRecord[]> {
    return waitFor(`${n} model calls`, async () => {
      const c = await this.calls();
      if (c.length > n) throw new Error(`expected ${n} model calls, got ${c.length}`);
      return c.length === n ? c : undefined;
    });
  }
}

function expectOk(r: HttpReply, what: string): HttpReply {
  if (r.status !== 200) throw new Error(`${what} answered HTTP ${r.status}: ${JSON.stringify(r.body)}`);
  return r;
}

export interface Gym {
  tmp: string;
  runDir: string;
  endpoints: Endpoints;
  backend: Backend;
  env: string;
  /** The model server's capture directory: the default, `<run dir>/capture/<server>`. */
  captureDir: string;
  url(server: string): string;
}

export async function bringUp(opts: GymOptions): Promise<Gym> {
  const tmp = mkdtempSync(join(tmpdir(), `model-e2e-${opts.topology}-`));
  const policy = join(tmp, 'policy.json');
  writeFileSync(policy, JSON.stringify(decisiveWeights()));
  const resources = opts.topology;
  const env = `${opts.topology}_env`;
  const yaml = [
    'checkpoint: { enabled: true, lease_grace_seconds: 600 }',
    'servers:',
    `  policy_backend: { kind: inference, options: { policy_file: ${JSON.stringify(policy)}, token_delay_ms: ${opts.tokenDelayMs ?? 0} } }`,
    `  policy_model:   { kind: model, options: { backend: policy_backend, checkpoint_policy: true, checkpoint_generation_cuts: ${opts.cuts ?? false} } }`,
    '  simple_agent:   { kind: agent, options: { model: policy_model, max_steps: 8 } }',
    `  ${resources}: { kind: resources, type: ${resources} }`,
    `  ${env}: { kind: environment, options: { agent: simple_agent, resources: ${resources} } }`,
    '',
  ].join('\n');
  const config = join(tmp, 'deployment.yaml');
  writeFileSync(config, yaml);
  const runDir = join(tmp, 'run');
  const gym: Gym = {
    tmp,
    runDir,
    endpoints: {},
    backend: new Backend(''),
    env,
    captureDir: join(runDir, 'capture', 'policy_model'),
    url(server) {
      const ep = this.endpoints[server];
      if (!ep) throw new Error(`no server '${server}'`);
      return ep.url;
    },
  };
  try {
    gym.endpoints = (await upDeployment({ config, runDir, env: ENV, healthTimeoutMs: 60_000 })).endpoints;
  } catch (err) {
    await tearDown(gym);
    throw err;
  }
  gym.backend = new Backend(gym.url('policy_backend'));
  return gym;
}

export async function tearDown(gym: Gym | undefined): Promise<void> {
  if (!gym) return;
  try {
    await downDeployment(gym.runDir, { graceMs: 2_000 });
  } catch {
    /* nothing running */
  }
  rmSync(gym.tmp, { recursive: true, force: true });
}

/** The reserved control pool of this test process (closed by the test file's afterAll). */
export const controlPool = createControlPool();

/** The checkpoint participants; discovery requires the policy model among them. */
export async function participants(gym: Gym): Promise<Participants> {
  const servers = Object.entries(gym.endpoints)
    .filter(([, e]) => e.kind !== 'inference')
    .map(([name, e]) => ({ name, url: e.url }));
  const found = await discover({ servers, token: TOKEN, pool: controlPool, probeTimeoutMs: 5_000, requireModel: true });
  return { token: TOKEN, pool: controlPool, members: found.members };
}

export async function modelStatus(gym: Gym): Promise<any> {
  const r = await http('GET', `${gym.url('policy_model')}${CONTROL_PREFIX}/status`, undefined, { authorization: `Bearer ${TOKEN}` });
  return expectOk(r, 'model status').body;
}

// --- episodes -------------------------------------------------------------------------------------

export interface RunHandle {
  key: string;
  done: Promise<void>;
  reply?: HttpReply;
  error?: unknown;
  settled: boolean;
}

export function startRun(gym: Gym, e: EpisodeId, task: Task): RunHandle {
  const h: RunHandle = { key: captureKey(e), done: Promise.resolve(), settled: false };
  h.done = http('POST', `${gym.url(gym.env)}/run`, { episode_id: e, task }).then(
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

export async function rewardOf(h: RunHandle, timeoutMs = 30_000): Promise<number> {
  await Promise.race([h.done, sleep(timeoutMs)]);
  if (!h.settled) throw new Error(`/run of ${h.key} did not reply within ${timeoutMs} ms`);
  const r = h.reply;
  if (r?.status !== 200 || !r.body?.result)
    throw new Error(`/run of ${h.key} failed: ${r ? `HTTP ${r.status} ${JSON.stringify(r.body).slice(0, 600)}` : String(h.error)}`);
  return r.body.result.reward as number;
}

// --- checkpoints ------------------------------------------------------------------------------------

export interface Committed {
  dir: string;
  prepared: PrepareResult;
  replies: Record<string, CommitReply>;
}

export async function prepareOnly(gym: Gym, id: string): Promise<PrepareResult> {
  const prepared = await prepare(await participants(gym), { checkpointId: id, deadlineTs: deadline() });
  if (!prepared.prepared) throw new Error(`checkpoint ${id} did not prepare: ${JSON.stringify(preparedBlockers(prepared))}`);
  return prepared;
}

export async function commitPrepared(gym: Gym, id: string, prepared: PrepareResult, episodes: EpisodeId[]): Promise<Committed> {
  const dir = join(gym.tmp, 'checkpoints', id);
  const replies = await commit(await participants(gym), {
    checkpointId: id,
    deadlineTs: deadline(),
    checkpointDir: dir,
    scope: continuedScope(prepared, episodes),
  });
  return { dir, prepared, replies };
}

export async function resumeAll(gym: Gym, id: string): Promise<void> {
  await resume(await participants(gym), { checkpointId: id, deadlineTs: deadline() });
}

/** SIGKILL of every Gym process (the backend survives); runs in flight die with the environment server. */
export async function crash(gym: Gym, runs: readonly RunHandle[] = []): Promise<void> {
  await killDeployment(gym.runDir);
  await Promise.all(runs.map((r) => r.done));
}

/** Fresh processes, then restore + resume of `scope` (checkpointed attempts) from `dir`. */
export async function restartAndRestore(
  gym: Gym,
  dir: string,
  restoreId: string,
  scope: EpisodeId[],
  beforeResume?: (dep: Participants) => Promise<void>,
): Promise<void> {
  await restartDeployment(gym.runDir, { env: ENV, healthTimeoutMs: 60_000 });
  const dep = await participants(gym);
  await restore(dep, { checkpointId: restoreId, deadlineTs: deadline(), checkpointDir: dir, scope });
  await beforeResume?.(dep);
  await resume(dep, { checkpointId: restoreId, deadlineTs: deadline() });
}

// --- the capture directory ------------------------------------------------------------------------

export function ledgerRows(gym: Gym, key: string): any[] {
  const file = ledgerPath(gym.captureDir, key);
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

/** Every capture key with a ledger file or token-store directory. */
export function captureKeysOnDisk(gym: Gym): { ledgers: string[]; tokens: string[] } {
  const ls = (d: string): string[] => (existsSync(d) ? readdirSync(d) : []);
  return {
    ledgers: ls(join(gym.captureDir, 'ledger'))
      .map((n) => n.replace(/\.lineage\.jsonl$/, ''))
      .sort(),
    tokens: ls(tokensDir(gym.captureDir)).sort(),
  };
}
