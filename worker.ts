// The controller's Temporal workers, in one process:
//  - the control task queue: every workflow, plus the coordination, snapshot and dataset activities;
//  - the rollout task queue: only the long `/run` activity, sized for thousands of concurrent rollouts,
//    so coordination calls never queue behind rollouts.
//   tsx worker.ts [--address 127.0.0.1:7233] [--namespace default] [--task-queue rollout-control] [--rollout-task-queue rollout-run]
// The Gym control token comes from GYM_CONTROL_TOKEN.
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { NativeConnection, Worker, bundleWorkflowCode, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { createActivities } from './activities/index.js';

export interface ControllerWorkerOptions {
  address: string;
  namespace?: string;
  taskQueue?: string;
  rolloutTaskQueue?: string;
  controlToken: string;
  /** Reuse a bundle across workers in one process (tests). */
  workflowBundle?: WorkflowBundleWithSourceMap;
  maxConcurrentRollouts?: number;
}

export interface ControllerWorkers {
  run(): Promise<void>;
  shutdown(): Promise<void>;
}

export const WORKFLOWS_PATH = fileURLToPath(new URL('./workflows/index.ts', import.meta.url));

export async function bundleWorkflows(): Promise<WorkflowBundleWithSourceMap> {
  return bundleWorkflowCode({ workflowsPath: WORKFLOWS_PATH, logger: undefined });
}

export async function createControllerWorkers(opts: ControllerWorkerOptions): Promise<ControllerWorkers> {
  const connection = await NativeConnection.connect({ address: opts.address });
  const activities = createActivities({ controlToken: opts.controlToken });
  const workflowBundle = opts.workflowBundle ?? (await bundleWorkflows());
  const control = await Worker.create({
    connection,
    namespace: opts.namespace ?? 'default',
    taskQueue: opts.taskQueue ?? 'rollout-control',
    workflowBundle,
    activities,
    maxConcurrentActivityTaskExecutions: 200,
    maxConcurrentWorkflowTaskExecutions: 64,
    maxCachedWorkflows: 4_000,
  });
  const rollouts = await Worker.create({
    connection,
    namespace: opts.namespace ?? 'default',
    taskQueue: opts.rolloutTaskQueue ?? 'rollout-run',
    activities: { runEpisode: activities.runEpisode },
    // Each /run holds a slot for its whole duration; they are I/O-bound.
    maxConcurrentActivityTaskExecutions: opts.maxConcurrentRollouts ?? 5_000,
    maxConcurrentActivityTaskPolls: 20,
    // Heartbeats go out every 0.8 × each `/run`'s heartbeat timeout (controller.run_heartbeat_timeout_s),
    // not capped at the default 60 s: every one is a server write per parked rollout.
    maxHeartbeatThrottleInterval: '1 hour',
  });
  let running: Promise<void> | undefined;
  return {
    run() {
      running ??= Promise.all([control.run(), rollouts.run()]).then(() => connection.close());
      return running;
    },
    async shutdown() {
      control.shutdown();
      rollouts.shutdown();
      await running;
    },
  };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      address: { type: 'string', default: process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233' },
      namespace: { type: 'string', default: 'default' },
      'task-queue': { type: 'string', default: 'rollout-control' },
      'rollout-task-queue': { type: 'string', default: 'rollout-run' },
    },
  });
  const controlToken = process.env.GYM_CONTROL_TOKEN;
  if (!controlToken) {
    console.error('worker: set GYM_CONTROL_TOKEN (the Gym deployment control token)');
    process.exit(2);
  }
  const workers = await createControllerWorkers({
    address: values.address!,
    namespace: values.namespace,
    taskQueue: values['task-queue'],
    rolloutTaskQueue: values['rollout-task-queue'],
    controlToken,
  });
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => void workers.shutdown());
  console.log(`worker: polling ${values['task-queue']} and ${values['rollout-task-queue']} on ${values.address}`);
  await workers.run();
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
