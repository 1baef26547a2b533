// Shared plumbing of the workflow tests: quiet logs, the bundle under test, run configs, one Worker
// per test with cleanup, polling, and golden histories (recorded and read back).
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { historyFromJSON, historyToJSON, type History } from '@temporalio/common/lib/proto-utils.js';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime, Worker, bundleWorkflowCode, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { RunConfigSchema, type RunConfig } from '../../protocol/run-config.js';
import { bundleWorkflows } from '../../worker.js';
import type { FakeGym } from './fake-gym.js';
import { sleep, waitFor } from '../helpers/wait.js';

export const HISTORIES_DIR = fileURLToPath(new URL('./histories/', import.meta.url));

/**
 * Quiet SDK logs (ERROR; INFO with WF_DEBUG=1), core's included: the scenarios fail activities and
 * workflow tasks on purpose. Once per process, before the first connection or replay.
 */
export function installQuietRuntime(): void {
  if (Runtime._instance !== undefined) return;
  const level = process.env.WF_DEBUG ? 'INFO' : 'ERROR';
  Runtime.install({ logger: new DefaultLogger(level), telemetryOptions: { logging: { filter: { core: level, other: level }, forward: {} } } });
}

/**
 * The workflow bundle under test. `WORKFLOWS_UNDER_TEST=<path to an index.ts>` bundles another
 * copy (checking that a scenario fails when its behaviour is removed from the workflows).
 */
export async function bundleUnderTest(): Promise<WorkflowBundleWithSourceMap> {
  const path = process.env.WORKFLOWS_UNDER_TEST;
  return path ? bundleWorkflowCode({ workflowsPath: path }) : bundleWorkflows();
}

type Sections = { [K in keyof RunConfig]?: Partial<RunConfig[K]> & Record<string, unknown> };

/** A small run (1 prompt × 2 generations per step, 2 steps, one group in flight) on its own task queue. */
export function runConfig(name: string, overrides: Sections = {}): RunConfig {
  const tq = `tq-${name}`;
  const base: Record<string, Record<string, unknown>> = {
    run: { name, gym_run_dir: '/nonexistent', checkpoint_dir: '/tmp/ckpt', task_queue: tq, rollout_task_queue: tq },
    grpo: { num_prompts_per_step: 1, num_generations_per_prompt: 2, max_num_steps: 2, tasksets: ['counter'] },
    async_rl: { max_in_flight_groups: 1 },
    // The trainer and its anchors have their own tests; these scenarios exercise the Gym side.
    trainer: { enabled: false },
    checkpointing: { enabled: false },
    // A cold start reads the checkpoint directory; these scenarios start fresh.
    rollout_checkpointing: { restore_mode: 'none' },
  };
  for (const [k, v] of Object.entries(overrides)) base[k] = { ...(base[k] ?? {}), ...(v as Record<string, unknown>) };
  return RunConfigSchema.parse(base);
}

/**
 * Runs `fn` with one Worker for the run's task queue, then terminates whatever the test left open
 * (a failed run's abandoned rollouts, a failed assertion's run): an open workflow with a pending
 * task would otherwise hold the shared server's clock for the next test.
 */
export async function withWorker<T>(
  env: TestWorkflowEnvironment,
  bundle: WorkflowBundleWithSourceMap,
  gym: FakeGym,
  cfg: RunConfig,
  fn: () => Promise<T>,
): Promise<T> {
  const worker = await Worker.create({
    connection: env.nativeConnection,
    taskQueue: cfg.run.task_queue,
    workflowBundle: bundle,
    activities: gym.activities(),
    // Cancellation reaches an activity only with a heartbeat's reply: send them within 100 ms
    // instead of at 80 % of the heartbeat timeout (48 s for `/run`).
    maxHeartbeatThrottleInterval: '100 ms',
  });
  try {
    return await worker.runUntil(fn());
  } finally {
    await terminateOpen(env, cfg.run.name);
  }
}

/** Terminates every open execution of the run and its children (legacy list: the test server has no visibility queries). */
export async function terminateOpen(env: TestWorkflowEnvironment, run: string): Promise<string[]> {
  const res = await env.client.workflowService.listOpenWorkflowExecutions({ namespace: 'default', maximumPageSize: 1000 });
  const open = (res.executions ?? []).map((e) => e.execution?.workflowId ?? '').filter((id) => id === run || id.startsWith(`${run}/`));
  await Promise.all(
    open.map((id) =>
      env.client.workflow
        .getHandle(id)
        .terminate('test cleanup')
        .catch(() => undefined),
    ),
  );
  return open;
}

/** Polls `pred` (real time) until it holds (test/helpers/wait.ts; this argument order for the workflow tests). */
export function until(pred: () => boolean | Promise<boolean>, what: string, timeoutMs = 15_000): Promise<unknown> {
  return waitFor(what, pred, { timeoutMs, intervalMs: 25 });
}

export { sleep as delay };

export interface RecordedWorkflow {
  workflowId: string;
  workflowType: string;
  history: unknown;
}

/** Golden histories: written when missing, or always with RECORD_HISTORIES=1. */
export async function recordHistories(env: TestWorkflowEnvironment, scenario: string, workflowIds: string[]): Promise<boolean> {
  const file = `${HISTORIES_DIR}${scenario}.json`;
  if (existsSync(file) && process.env.RECORD_HISTORIES !== '1') return false;
  const workflows: RecordedWorkflow[] = [];
  for (const workflowId of workflowIds) {
    const handle = env.client.workflow.getHandle(workflowId);
    const [history, desc] = await Promise.all([handle.fetchHistory(), handle.describe()]);
    workflows.push({ workflowId, workflowType: desc.type, history: historyJson(history) });
  }
  await mkdir(HISTORIES_DIR, { recursive: true });
  await writeFile(file, `${JSON.stringify({ scenario, workflows }, null, 1)}\n`);
  return true;
}

export async function readHistories(scenario: string): Promise<RecordedWorkflow[]> {
  const parsed = JSON.parse(await readFile(`${HISTORIES_DIR}${scenario}.json`, 'utf8')) as { workflows: RecordedWorkflow[] };
  return parsed.workflows;
}

// --- history JSON ---------------------------------------------------------------------------------
// `@temporalio/common/lib/proto-utils` (historyToJSON / historyFromJSON) uses the protobufjs copy
// nested under @temporalio/common, while the History type comes from the copy nested under
// @temporalio/proto; with this install's layout (protobufjs 7 hoisted for grpc, three nested 8.x
// copies) its `instanceof Type` check fails ("type must be a Type"). Same conversion, done with
// the protobufjs copy that owns the types; the SDK's functions are tried first.
const requireHere = createRequire(import.meta.url);
const requireFromProto = createRequire(requireHere.resolve('@temporalio/proto'));
type ProtoJson = { toJson(type: unknown, message: unknown): unknown; fromJson(type: unknown, json: unknown, opts: unknown): unknown };
type HistoryType = { fromObject(o: unknown): unknown };

function protoHistory(): { protojson: ProtoJson; type: HistoryType } {
  const protojson = requireFromProto('protobufjs/ext/protojson') as ProtoJson;
  const proto = requireHere('@temporalio/proto') as unknown;
  const { patchProtobufRoot } = requireHere('@temporalio/proto/lib/patch-protobuf-root') as {
    patchProtobufRoot(r: unknown): { lookupType(n: string): HistoryType };
  };
  return { protojson, type: patchProtobufRoot(proto).lookupType('temporal.api.history.v1.History') };
}

export function historyJson(history: History): unknown {
  try {
    return JSON.parse(historyToJSON(history)) as unknown;
  } catch (err) {
    if (!(err instanceof Error) || !/must be a Type/.test(err.message)) throw err;
    const { protojson, type } = protoHistory();
    return protojson.toJson(type, type.fromObject(history));
  }
}

export function historyFromJson(json: unknown): History {
  try {
    return historyFromJSON(json);
  } catch (err) {
    if (!(err instanceof Error) || !/must be a Type/.test(err.message)) throw err;
    const { protojson, type } = protoHistory();
    return protojson.fromJson(type, json, { ignoreUnknownFields: true }) as History;
  }
}
