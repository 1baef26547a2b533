// The trainer activities in a MockActivityEnvironment against an in-process tiny-policy backend on
// 127.0.0.1: a step trains from the call log and refits the backend, anchors round-trip, a lost
// trainer reports `trainer_behind` and re-sent batches reproduce the lost steps exactly, corrupt
// anchors are skipped, a retried step is idempotent. Plus the trajectory assembly from the call log.
import { packJson } from '../../protocol/packed-json.js';
import { writeLedgerPart } from '../../activities/controller-files.js';
import { createHash } from 'node:crypto';
import net from 'node:net';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { canonicalJson } from '../../protocol/canonical-json.js';
import {
  GYM_RESTART_FALLBACK_FILE,
  TRAINER_FILE,
  createTrainerActivities,
  peekTrainerState,
  siblingTrajectory,
  type CallRecordLike,
  type TrainBatch,
  type TrainStepInput,
  type TrainStepResult,
  type TrainerState,
} from '../../activities/trainer.js';
import { rolloutPath } from '../../protocol/ids.js';
import type { ChatMessage } from '../../protocol/openai.js';
import { CITIES, TASKSETS, genrmPromptId, renderTaskLine, type TaskLine } from '../../protocol/tasks.js';
import { buildInferenceApp } from '../../servers/inference/app.js';
import { genrmAnswerOf } from '../../servers/inference/answers.js';
import { DEFAULT_MAX_STEPS, expectedReward, genrmScore } from '../../servers/inference/evaluate.js';
import { COUNTER_TOOL, WEATHER_TOOL, initialWeights, type PolicyWeights } from '../../servers/inference/policy.js';
import { tempDir } from '../helpers/temp-dir.js';
import { failureOf, mockEnv, runActivity } from '../helpers/activity.js';

const RUN = 'run1';
const FINGERPRINT = 'a'.repeat(64);

let tmp: string;
let ckpt: string;
let app: FastifyInstance;
let url: string;
let states: Map<string, TrainerState>;
let logs: { message: string; fields: Record<string, unknown> }[];
let acts: ReturnType<typeof createTrainerActivities>;

beforeEach(async () => {
  tmp = tempDir('trainer');
  ckpt = path.join(tmp, 'ckpt');
  ({ app } = await buildInferenceApp({ name: 'llm', logLevel: 'silent' }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  url = `http://127.0.0.1:${(app.server.address() as net.AddressInfo).port}`;
  states = new Map();
  logs = [];
  acts = createTrainerActivities({ states, log: (message, fields) => logs.push({ message, fields }) });
});
afterEach(async () => {
  await app.close();
});

async function served(): Promise<PolicyWeights> {
  const res = await app.inject({ method: 'GET', url: '/_ctl/policy' });
  return res.json() as PolicyWeights;
}

// --- episodes through the backend, as the agent would drive them ---------------------------------

function taskLine(i: number): TaskLine {
  const taskset = TASKSETS[i % TASKSETS.length]!;
  const k = Math.floor(i / TASKSETS.length);
  if (taskset === 'counter') return { taskset, start: k % 6, target: (k % 6) + 2 + ((k * 7) % 5) };
  if (taskset === 'weather') return { taskset, city: CITIES[(k * 3) % CITIES.length]! };
  return { taskset, prompt: genrmPromptId(k % 48) };
}

async function episode(key: string, line: TaskLine): Promise<number> {
  const messages: ChatMessage[] = [
    { role: 'developer', content: 'You are a helpful assistant.' },
    { role: 'user', content: `Please help.\n${renderTaskLine(line)}` },
  ];
  let counter = line.taskset === 'counter' ? line.start : 0;
  let rightCity = false;
  for (let step = 0; step < DEFAULT_MAX_STEPS; step++) {
    const res = await app.inject({ method: 'POST', url: rolloutPath(key, '/v1/chat/completions'), payload: { messages } });
    expect(res.statusCode).toBe(200);
    const message = (res.json() as { choices: { message: ChatMessage }[] }).choices[0]!.message;
    messages.push(message);
    const call = message.tool_calls?.[0];
    if (!call) {
      if (line.taskset === 'genrm') return genrmScore(genrmAnswerOf(line.prompt, String(message.content)) ?? '');
      break;
    }
    const args = JSON.parse(call.function.arguments) as { count?: number; city?: string };
    if (call.function.name === COUNTER_TOOL) counter += args.count ?? 0;
    if (call.function.name === WEATHER_TOOL && line.taskset === 'weather' && args.city === line.city) rightCity = true;
    messages.push({ role: 'tool', tool_call_id: call.id, content: '{"success": true}' });
  }
  if (line.taskset === 'counter') return counter === line.target ? 1 : 0;
  if (line.taskset === 'weather') return rightCity ? 1 : 0;
  return 0;
}

/** 4 groups × 4 siblings of step `step`, run against whatever the backend serves now. */
async function collect(step: number, prefix = RUN): Promise<TrainBatch> {
  const batch: TrainBatch = [];
  for (let g = 0; g < 4; g++) {
    const cursor = (step - 1) * 4 + g;
    const line = taskLine(cursor);
    const siblings = [];
    for (let k = 0; k < 4; k++) {
      const rollout_id = `${prefix}.s${step}.g${g}.${k}`;
      siblings.push({ rollout_id, reward: await episode(rollout_id, line), mask: false, captureKeys: [rollout_id] });
    }
    batch.push({ group_id: `${prefix}.g${cursor}`, siblings });
  }
  return batch;
}

const stepInput = (step: number, batch: TrainBatch, extra: Partial<TrainStepInput> = {}): TrainStepInput => ({
  run: RUN,
  checkpointDir: ckpt,
  backendUrl: url,
  expectedVersion: step - 1,
  step,
  batch,
  cursor: step * 4,
  ...extra,
});

const meanExpected = (w: PolicyWeights): number => TASKSETS.reduce((s, t) => s + expectedReward(w, t), 0) / TASKSETS.length;

// --- trainStep ----------------------------------------------------------------------------------------

describe('trainStep', () => {
  it('trains from the call log and refits the backend to the new version', async () => {
    const batch = await collect(1);
    const calls = (await app.inject({ method: 'GET', url: '/_ctl/calls' })).json() as unknown[];
    const env = mockEnv();
    const beats: unknown[] = [];
    env.on('heartbeat', (d: unknown) => beats.push(d));
    const r: TrainStepResult = await env.run(acts.trainStep, stepInput(1, batch));
    expect(r.version).toBe(1);
    expect(r.step).toBe(1);
    expect(r.usedCalls).toBe(calls.length);
    expect(r.droppedCalls).toEqual({ notReturned: 0, superseded: 0, otherVersion: 0, unknown: 0 });
    const rewards = batch.flatMap((g) => g.siblings.map((s) => s.reward));
    expect(r.meanReward).toBeCloseTo(rewards.reduce((a, b) => a + b, 0) / rewards.length, 12);
    expect(r.updatedSituations.length).toBeGreaterThan(0);
    expect(r.seconds).toBeGreaterThanOrEqual(0);
    expect(beats).toEqual([]); // a step that ends within the heartbeat interval sends none

    const w = await served();
    expect(w.version).toBe(1);
    const st = peekTrainerState(RUN, states)!;
    expect(w.logits).toEqual(st.logits);
    expect(st).toMatchObject({ version: 1, step: 1, cursor: 4 });
    expect(st.optimizer.t).toBe(1);
    // Only visited situations moved.
    const init = initialWeights().logits;
    for (const s of Object.keys(init)) {
      if (r.updatedSituations.includes(s)) expect(st.logits[s]).not.toEqual(init[s]);
      else expect(st.logits[s]).toEqual(init[s]);
    }
  });

  it('the served policy learns: expected reward over 10 steps of 4 groups × 4 siblings', async () => {
    const curve = [meanExpected(await served())];
    const rewards: number[] = [];
    for (let step = 1; step <= 10; step++) {
      const r = await runActivity(acts.trainStep, stepInput(step, await collect(step)));
      rewards.push(r.meanReward);
      const w = await served();
      expect(w.version).toBe(step);
      curve.push(meanExpected(w));
    }
    console.log(`served policy, expected reward: ${curve.map((x) => x.toFixed(3)).join(' → ')}`);
    console.log(`batch mean reward: ${rewards.map((x) => x.toFixed(2)).join(' ')}`);
    expect(curve[10]!).toBeGreaterThan(curve[0]! + 0.3);
  });

  it('a retried step returns the same result and refits again; another batch for the same version is refused', async () => {
    const batch = await collect(1);
    const input = stepInput(1, batch);
    const first = await runActivity(acts.trainStep, input);
    const logits = (await served()).logits;
    // The backend lost the refit (restart): the retry puts it back.
    await app.inject({ method: 'POST', url: '/_ctl/policy', payload: initialWeights() });
    const again = await runActivity(acts.trainStep, structuredClone(input));
    expect(again).toEqual(first);
    expect(await served()).toEqual({ version: 1, logits });
    expect(peekTrainerState(RUN, states)!.optimizer.t).toBe(1);

    const other = structuredClone(batch);
    other[0]!.siblings[0]!.reward = 0.123;
    const f = await failureOf(runActivity(acts.trainStep, stepInput(1, other)));
    expect(f.type).toBe('trainer_ahead');
    expect(f.nonRetryable).toBe(true);
    expect(f.details?.[0]).toMatchObject({ have: 1, step: 1, expected: 0 });
  });

  it('a fresh trainer starts from the initial weights at version 0 and refits the backend to them', async () => {
    await app.inject({ method: 'POST', url: '/_ctl/policy', payload: { version: 7, logits: {} } });
    const f = await failureOf(runActivity(acts.trainStep, stepInput(4, [])));
    expect(f.type).toBe('trainer_behind');
    expect(f.nonRetryable).toBe(true);
    expect(f.details?.[0]).toEqual({ have: 0, step: 0 });
    expect(await served()).toEqual(initialWeights());
  });

  it('an unreachable backend is a retryable failure and leaves no state', async () => {
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    await new Promise<void>((r) => srv.close(() => r()));
    const f = await failureOf(runActivity(acts.trainStep, stepInput(1, [], { backendUrl: `http://127.0.0.1:${port}` })));
    expect(f.type).toBe('backend_unavailable');
    expect(f.nonRetryable).toBe(false);
    expect(peekTrainerState(RUN, states)).toBeUndefined();
  });

  it('rejects malformed input for good', async () => {
    const f = await failureOf(runActivity(acts.trainStep, { ...stepInput(1, []), expectedVersion: -1 }));
    expect(f.type).toBe('invariant_error');
    expect(f.nonRetryable).toBe(true);
    const g = await failureOf(
      runActivity(acts.trainStep, stepInput(1, [{ group_id: 'g', siblings: [{ rollout_id: 'r', reward: 1, mask: false, captureKeys: ['bad key'] }] }])),
    );
    expect(g.type).toBe('invariant_error');
  });
});

// --- anchors ------------------------------------------------------------------------------------------

describe('trainer anchors', () => {
  it('round-trip: save, fallback marker, latest, drop, restore (refit), and the run continues identically', async () => {
    const b1 = await collect(1);
    await runActivity(acts.trainStep, stepInput(1, b1));
    const b2 = await collect(2);
    await runActivity(acts.trainStep, stepInput(2, b2));
    const saved = await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 2, cursor: 8 });
    expect(saved).toMatchObject({ anchor: 'step_2', path: path.join(ckpt, 'step_2', TRAINER_FILE), version: 2 });

    const file = JSON.parse(await fsp.readFile(saved.path, 'utf8')) as Record<string, unknown>;
    expect(Object.keys(file)).toEqual(['cursor', 'format', 'logits', 'optimizer', 'run', 'schema_version', 'sha256', 'step', 'version']);
    expect(file).toMatchObject({ schema_version: 1, run: RUN, step: 2, version: 2, cursor: 8, sha256: saved.sha256 });
    const { sha256, ...body } = file;
    expect(createHash('sha256').update(canonicalJson(body)).digest('hex')).toBe(sha256);
    expect((await fsp.readdir(path.join(ckpt, 'step_2'))).filter((n) => n.startsWith('.'))).toEqual([]);

    // The run sends its ledger packed; the marker holds it plain.
    const marker = await runActivity(acts.writeGymRestartFallback, {
      checkpointDir: ckpt,
      step: 2,
      trainerVersion: 2,
      topologyFingerprint: FINGERPRINT,
      ledger: packJson({ run: 'r' }),
    });
    expect(marker.path).toBe(path.join(ckpt, 'step_2', GYM_RESTART_FALLBACK_FILE));
    expect(JSON.parse(await fsp.readFile(marker.path, 'utf8'))).toEqual({
      base_train_step: 2,
      gym_topology_fingerprint: FINGERPRINT,
      ledger: { run: 'r' },
      schema_version: 2,
      trainer_version: 2,
    });
    // Read back without the ledger (each rollout shard loads its slice from the file), with where it is.
    const read = await runActivity(acts.readGymRestartFallback, { checkpointDir: ckpt, anchor: 'step_2' });
    expect(read).toEqual({
      schema_version: 2,
      base_train_step: 2,
      trainer_version: 2,
      gym_topology_fingerprint: FINGERPRINT,
      file: marker.path,
      cursor: 0,
    });
    expect(await runActivity(acts.readGymRestartFallback, { checkpointDir: ckpt, anchor: 'step_1' })).toBeNull();

    // The run saves anchor and marker in one call; a retry after the anchor is durable (the
    // trainer has moved on) still writes a marker that is missing.
    await fsp.rm(marker.path);
    const fallback = { topologyFingerprint: FINGERPRINT, ledger: packJson({ run: 'r2' }) };
    expect(await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 2, cursor: 8, gymRestartFallback: fallback })).toEqual(saved);
    const reread = await runActivity(acts.readGymRestartFallback, { checkpointDir: ckpt, anchor: 'step_2' });
    expect(reread).toMatchObject({ trainer_version: 2 });
    expect(JSON.parse(await fsp.readFile(marker.path, 'utf8')).ledger).toEqual({ run: 'r2' });
    // The rollout shards' ledger parts, merged into the marker with the run's cursor.
    await fsp.rm(marker.path);
    const partsDir = path.join(ckpt, 'fallback-parts', 'step_2');
    await writeLedgerPart({
      dir: partsDir,
      shard: 0,
      ledger: packJson({ schema_version: 1, run: RUN, cursor: 0, groups: { a: { x: 1 } }, order: ['a'] }),
      create: true,
    });
    await writeLedgerPart({
      dir: partsDir,
      shard: 1,
      ledger: packJson({ schema_version: 1, run: RUN, cursor: 0, groups: { b: { x: 2 } }, order: ['b'] }),
      create: true,
    });
    const parts = { topologyFingerprint: FINGERPRINT, ledgerParts: { dir: partsDir, files: ['controller/ledger-0.json', 'controller/ledger-1.json'] } };
    expect(await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 2, cursor: 8, gymRestartFallback: parts })).toEqual(saved);
    expect(JSON.parse(await fsp.readFile(marker.path, 'utf8')).ledger).toEqual({
      schema_version: 1,
      run: RUN,
      cursor: 8,
      groups: { a: { x: 1 }, b: { x: 2 } },
      order: ['a', 'b'],
    });
    expect(await runActivity(acts.readGymRestartFallback, { checkpointDir: ckpt, anchor: 'step_2' })).toMatchObject({ cursor: 8 });
    const badFingerprint = await failureOf(
      runActivity(acts.saveTrainerCheckpoint, {
        run: RUN,
        checkpointDir: ckpt,
        step: 2,
        cursor: 8,
        gymRestartFallback: { ...fallback, topologyFingerprint: '' },
      }),
    );
    expect(badFingerprint.type).toBe('invariant_error');

    expect(await runActivity(acts.latestTrainerAnchor, { checkpointDir: ckpt })).toEqual({ anchor: 'step_2', step: 2, version: 2, cursor: 8, skipped: [] });

    const before = peekTrainerState(RUN, states)!;
    const b3 = await collect(3);
    expect(await runActivity(acts.dropTrainerState, { run: RUN })).toEqual({ dropped: true });
    await app.inject({ method: 'POST', url: '/_ctl/policy', payload: initialWeights() });
    expect(await runActivity(acts.restoreTrainer, { run: RUN, checkpointDir: ckpt, backendUrl: url })).toEqual({
      version: 2,
      step: 2,
      cursor: 8,
      anchor: 'step_2',
      skipped: [],
    });
    const restored = peekTrainerState(RUN, states)!;
    expect(restored.logits).toEqual(before.logits);
    expect(restored.optimizer).toEqual(before.optimizer);
    expect(await served()).toEqual({ version: 2, logits: before.logits });

    // Step 3 from the restored trainer equals step 3 from one that never crashed.
    const r3 = await runActivity(acts.trainStep, stepInput(3, b3));
    const twin = new Map<string, TrainerState>([[RUN, { ...before, last: undefined }]]);
    const other = createTrainerActivities({ states: twin, log: () => {} });
    const t3 = await runActivity(other.trainStep, stepInput(3, b3));
    expect({ ...r3, seconds: 0 }).toEqual({ ...t3, seconds: 0 });
    expect(peekTrainerState(RUN, states)!.logits).toEqual(twin.get(RUN)!.logits);

    // Restoring the bootstrap anchor goes back to the initial weights.
    expect(await runActivity(acts.restoreTrainer, { run: RUN, checkpointDir: ckpt, backendUrl: url, anchor: 'bootstrap' })).toMatchObject({
      version: 0,
      step: 0,
      anchor: 'bootstrap',
    });
    expect(await served()).toEqual(initialWeights());
  });

  it('trainer_behind after a lost trainer when the newest anchor is older; re-sent batches reproduce the lost steps', async () => {
    const batches = [await collect(1)];
    await runActivity(acts.trainStep, stepInput(1, batches[0]!));
    await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 4 });
    batches.push(await collect(2));
    await runActivity(acts.trainStep, stepInput(2, batches[1]!));
    const lost = peekTrainerState(RUN, states)!;
    batches.push(await collect(3));

    await runActivity(acts.dropTrainerState, { run: RUN });
    const f = await failureOf(runActivity(acts.trainStep, stepInput(3, batches[2]!)));
    expect(f.type).toBe('trainer_behind');
    expect(f.nonRetryable).toBe(true);
    expect(f.details?.[0]).toEqual({ have: 1, step: 1 });
    expect((await served()).version).toBe(1); // the fresh trainer refitted the anchor's weights

    // The workflow re-sends the batches after the anchor.
    const r2 = await runActivity(acts.trainStep, stepInput(2, batches[1]!));
    expect(r2.version).toBe(2);
    const again = peekTrainerState(RUN, states)!;
    expect(again.logits).toEqual(lost.logits);
    expect(again.optimizer).toEqual(lost.optimizer);
    expect((await runActivity(acts.trainStep, stepInput(3, batches[2]!))).version).toBe(3);
    expect((await served()).version).toBe(3);
  });

  it('skips corrupt anchors (reported), ignores step dirs without trainer.json, refuses a named corrupt one', async () => {
    await runActivity(acts.trainStep, stepInput(1, await collect(1)));
    await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 4 });
    await runActivity(acts.trainStep, stepInput(2, await collect(2)));
    const s2 = await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 2, cursor: 8 });
    // step_2: a logit changed behind the digest's back; step_3: a torn write; step_5: snapshots only (no anchor).
    const doc = JSON.parse(await fsp.readFile(s2.path, 'utf8')) as { logits: Record<string, Record<string, number>> };
    doc.logits.genrm!.answer_a = 9;
    await fsp.writeFile(s2.path, JSON.stringify(doc));
    await fsp.mkdir(path.join(ckpt, 'step_3'));
    await fsp.writeFile(path.join(ckpt, 'step_3', TRAINER_FILE), '{"schema_version": 1, "ru');
    await fsp.mkdir(path.join(ckpt, 'step_5', 'rollout_snapshots'), { recursive: true });

    const latest = await runActivity(acts.latestTrainerAnchor, { checkpointDir: ckpt, run: RUN });
    expect(latest).toMatchObject({ anchor: 'step_1', step: 1, version: 1, cursor: 4 });
    expect(latest!.skipped.map((s) => s.anchor)).toEqual(['step_3', 'step_2']);
    expect(latest!.skipped[0]!.reason).toMatch(/not JSON/);
    expect(latest!.skipped[1]!.reason).toMatch(/sha256/);
    expect(logs.some((l) => l.message === 'corrupt trainer anchors skipped')).toBe(true);

    await runActivity(acts.dropTrainerState, { run: RUN });
    const f = await failureOf(runActivity(acts.trainStep, stepInput(3, await collect(3))));
    expect(f.type).toBe('trainer_behind');
    expect(f.details?.[0]).toEqual({ have: 1, step: 1 });

    const named = await failureOf(runActivity(acts.restoreTrainer, { run: RUN, checkpointDir: ckpt, backendUrl: url, anchor: 'step_2' }));
    expect(named.type).toBe('invariant_error');
    expect(named.nonRetryable).toBe(true);
    expect(named.message).toMatch(/sha256/);
    const missing = await failureOf(runActivity(acts.restoreTrainer, { run: RUN, checkpointDir: ckpt, backendUrl: url, anchor: 'step_5' }));
    expect(missing.message).toMatch(/no trainer\.json/);
  });

  it('an anchor of another run is skipped', async () => {
    await runActivity(acts.trainStep, stepInput(1, await collect(1)));
    await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 4 });
    const latest = await runActivity(acts.latestTrainerAnchor, { checkpointDir: ckpt, run: 'someone-else' });
    expect(latest).toBeNull();
    expect(logs.at(-1)!.fields.skipped).toEqual([{ anchor: 'step_1', reason: expect.stringMatching(/belongs to run 'run1'/) as unknown }]);
  });

  it('saving is idempotent for a step already anchored, and refuses a step the trainer moved past', async () => {
    await runActivity(acts.trainStep, stepInput(1, await collect(1)));
    const s1 = await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 4 });
    await runActivity(acts.trainStep, stepInput(2, await collect(2)));
    expect(await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 4 })).toEqual(s1);
    const moved = await failureOf(runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 5 }));
    expect(moved.type).toBe('trainer_state_changed');
    expect(moved.nonRetryable).toBe(true);
    const ahead = await failureOf(runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 3, cursor: 12 }));
    expect(ahead.type).toBe('trainer_behind');
    // A lost trainer cannot save either; it reports what a fresh one would load.
    await runActivity(acts.dropTrainerState, { run: RUN });
    const lost = await failureOf(runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 2, cursor: 8 }));
    expect(lost.type).toBe('trainer_behind');
    expect(lost.details?.[0]).toEqual({ have: 1, step: 1 });
  });

  it('the fallback marker needs the durable anchor of the same version first', async () => {
    const none = await failureOf(
      runActivity(acts.writeGymRestartFallback, { checkpointDir: ckpt, step: 1, trainerVersion: 1, topologyFingerprint: FINGERPRINT, ledger: { run: 'r' } }),
    );
    expect(none.type).toBe('invariant_error');
    await runActivity(acts.trainStep, stepInput(1, await collect(1)));
    await runActivity(acts.saveTrainerCheckpoint, { run: RUN, checkpointDir: ckpt, step: 1, cursor: 4 });
    const wrong = await failureOf(
      runActivity(acts.writeGymRestartFallback, { checkpointDir: ckpt, step: 1, trainerVersion: 2, topologyFingerprint: FINGERPRINT, ledger: { run: 'r' } }),
    );
    expect(wrong.message).toMatch(/version 1, not 2/);
    await fsp.writeFile(path.join(ckpt, 'step_1', GYM_RESTART_FALLBACK_FILE), '{}');
    const bad = await failureOf(runActivity(acts.readGymRestartFallback, { checkpointDir: ckpt, anchor: 'step_1' }));
    expect(bad.type).toBe('invariant_error');
  });
});

// --- trajectories from the call log --------------------------------------------------------------------

describe('siblingTrajectory', () => {
  let index = 0;
  const rec = (capture_key: string, n_messages: number, action: string, version = 3, returned = true): CallRecordLike => ({
    index: index++,
    capture_key,
    attempt: /-a(\d+)$/.exec(capture_key) ? Number(/-a(\d+)$/.exec(capture_key)![1]) : 0,
    n_messages,
    situation: 'genrm',
    action,
    version,
    ...(returned ? { returned: true } : {}),
  });

  it('a continued attempt supersedes the original from the turn it continued at', () => {
    const log = [
      rec('r', 2, 'answer_a'),
      rec('other', 2, 'answer_d'),
      rec('r', 4, 'answer_b'),
      rec('r', 6, 'answer_c'), // made after the snapshot's cut: redone by r-a1
      rec('r', 8, 'answer_d', 3, false), // cut off by the crash
      rec('r-a1', 6, 'answer_a'),
      rec('r-a1', 8, 'answer_b'),
    ];
    const t = siblingTrajectory(log, ['r', 'r-a1']);
    expect(t.calls.map((c) => c.action)).toEqual(['answer_a', 'answer_b', 'answer_a', 'answer_b']);
    expect(t.version).toBe(3);
    expect(t.dropped).toEqual({ notReturned: 1, superseded: 1, otherVersion: 0 });
  });

  it('a restart from the task supersedes everything before it; a repeated call keeps the latest', () => {
    const log = [rec('r', 2, 'answer_a'), rec('r', 4, 'answer_b'), rec('r-a1', 2, 'answer_c'), rec('r-a1', 2, 'answer_d')];
    const t = siblingTrajectory(log, ['r', 'r-a1']);
    expect(t.calls.map((c) => c.action)).toEqual(['answer_d']);
    expect(t.dropped.superseded).toBe(3);
  });

  it('keeps the calls of the version the rollout ran under', () => {
    const log = [rec('r', 2, 'answer_a', 3), rec('r', 4, 'answer_b', 4), rec('r', 6, 'answer_c', 4)];
    const first = siblingTrajectory(log, ['r']);
    expect(first.version).toBe(3);
    expect(first.calls.map((c) => c.action)).toEqual(['answer_a']);
    expect(first.dropped.otherVersion).toBe(2);
    const given = siblingTrajectory(log, ['r'], 4);
    expect(given.calls.map((c) => c.action)).toEqual(['answer_b', 'answer_c']);
    expect(siblingTrajectory(log, ['nobody'])).toEqual({ calls: [], version: null, dropped: { notReturned: 0, superseded: 0, otherVersion: 0 } });
  });
});
