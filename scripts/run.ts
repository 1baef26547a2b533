// The client script of the controller: `npm run run -- <verb> <arg>` (start, status,
// checkpoint-now, stop, wait); `--help` lists the verbs, options and environment (RUN_CLI).
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import {
  ActivityFailure,
  ApplicationFailure,
  CancelledFailure,
  ChildWorkflowFailure,
  Client,
  type Connection,
  NamespaceNotFoundError,
  ServiceError,
  TerminatedFailure,
  TimeoutFailure,
  WorkflowExecutionAlreadyStartedError,
  WorkflowFailedError,
  WorkflowNotFoundError,
  WorkflowUpdateRPCTimeoutOrCancelledError,
  WorkflowUpdateStage,
  type WorkflowExecutionDescription,
  type WorkflowHandle,
} from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import { parse as parseYaml } from 'yaml';
import { RunConfigSchema, type RunConfig } from '../protocol/run-config.js';
import { ConfigError, parseConfig } from '../servers/common/config-error.js';
import { checkpointNow, runStatus, stopRun, type RunStatus } from '../workflows/messages.js';
import { MAX_KEPT_OUTCOMES } from '../workflows/run/state.js';
import { trainingRun } from '../workflows/trainingRun.js';
import { defineCommand, exitWithUsageError, parseCommandLine } from './cli.mjs';
import { CONNECTION_ENV, CONNECTION_FLAGS, ConnectFailure, connectWithin, targetOf } from './temporal-connect.js';

export const RUN_CLI = defineCommand({
  name: 'run',
  invocation: 'npm run run',
  usage: ['npm run run -- <verb> <arg> [--address HOST:PORT] [--namespace NS] [--connect-timeout-s N]'],
  summary: 'The controller client: starts a training run on Temporal and steers it. The worker (`npm run worker`) must be running for a run to make progress.',
  verbs: [
    { name: 'start', args: '<config.yaml>', help: 'start a training run from a run config (examples/run.yaml); its workflow ID is run.name' },
    { name: 'status', args: '<run>', help: "print the running run's status (the `status` query) as JSON" },
    { name: 'checkpoint-now', args: '<run>', help: 'take a checkpoint now and print its outcome as JSON (the `checkpointNow` update)' },
    { name: 'stop', args: '<run>', help: 'ask the run to stop: no new rollouts; it finishes those in flight, then ends' },
    {
      name: 'wait',
      args: '<run>',
      help:
        'wait for the run to end and print its summary as JSON; on a terminal, a progress line (step, mean reward of the last step, rollouts in flight, checkpoints) meanwhile. ' +
        'A run that failed prints its failure and every cause (type and message), one line each',
    },
  ],
  flags: {
    ...CONNECTION_FLAGS,
  },
  env: [CONNECTION_ENV],
  notes: [
    'status, checkpoint-now and stop need a running run; on a finished or unknown one they say so and exit 1, as status and checkpoint-now do when no worker takes the query or update within 10 s.',
    'Exit status: 0 done; 1 the verb failed (Temporal unreachable, no such run, run already finished, the run failed); 2 a usage or run config error.',
  ],
});

export function loadRunConfig(file: string): RunConfig {
  let raw: unknown;
  try {
    raw = parseYaml(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(file, `cannot read run config: ${(err as Error).message}`);
  }
  return parseConfig(RunConfigSchema, raw, '');
}

/**
 * Starts the run. Its name is taken once: its shards, checkpoint attempts and rollout attempts are
 * named after it, so a second run under a finished one's name would find every attempt ID taken
 * (`WorkflowExecutionAlreadyStartedError` either way; `takenNameFailure` tells the two apart).
 */
export async function startRun(client: Client, config: RunConfig) {
  return client.workflow.start(trainingRun, {
    workflowId: config.run.name,
    workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
    taskQueue: config.run.task_queue,
    args: [{ config }],
    staticSummary: `training run ${config.run.name}`,
    staticDetails:
      `${config.grpo.max_num_steps} steps × ${config.grpo.num_prompts_per_step} prompts × ${config.grpo.num_generations_per_prompt} generations ` +
      `over ${config.grpo.tasksets.join(', ')}; checkpoints every ${config.rollout_checkpointing.snapshot_attempt_interval_s ?? '—'} s into \`${config.run.checkpoint_dir}\``,
    memo: { run: config.run.name },
  });
}

/** A failure explained in sentences for the user: printed as is, exit 1. */
export class CliFailure extends Error {}

/** Why a run name cannot be started: a run under it is still running, or one has already run. */
export async function takenNameFailure(client: Client, name: string): Promise<CliFailure> {
  const status = await client.workflow
    .getHandle(name)
    .describe()
    .then((d) => d.status.name)
    .catch(() => undefined);
  if (status === undefined || status === 'RUNNING') return new CliFailure(`a run named ${name} is already running`);
  return new CliFailure(`a run named ${name} has already run (${status}); a name is used once, as its attempts are named after it: set run.name to a new name`);
}

const oneLine = (s: string): string => s.replace(/\s*\n\s*/g, ' ').trim();

/** One line for one failure of a chain: its kind, what Temporal knows of it, its message. */
function failureLine(err: unknown): string {
  if (err instanceof ApplicationFailure) {
    return `ApplicationFailure [${err.type ?? 'untyped'}]${err.nonRetryable ? ' (non-retryable)' : ''}: ${oneLine(err.message)}`;
  }
  if (err instanceof ActivityFailure) return `ActivityFailure (activity ${err.activityType}, ${err.retryState}): ${oneLine(err.message)}`;
  if (err instanceof ChildWorkflowFailure) {
    return `ChildWorkflowFailure (${err.workflowType} ${err.execution.workflowId}, ${err.retryState}): ${oneLine(err.message)}`;
  }
  if (err instanceof TimeoutFailure) return `TimeoutFailure (${err.timeoutType}): ${oneLine(err.message)}`;
  if (err instanceof Error) return `${err.name}: ${oneLine(err.message)}`;
  return oneLine(String(err));
}

/** The failure and each of its causes, outermost first, one line each, no stacks. */
export function failureLines(err: unknown): string[] {
  const lines: string[] = [];
  const seen = new Set<unknown>();
  for (let e: unknown = err; e !== undefined && e !== null && !seen.has(e) && lines.length < 20; e = (e as { cause?: unknown }).cause) {
    seen.add(e);
    lines.push(`${lines.length ? 'caused by ' : ''}${failureLine(e)}`);
  }
  return lines;
}

/** What `wait` prints for a run that did not complete: a headline, then the cause chain. */
export function runFailureText(run: string, err: WorkflowFailedError): string {
  const how =
    err.cause instanceof TerminatedFailure
      ? 'was terminated'
      : err.cause instanceof CancelledFailure
        ? 'was cancelled'
        : err.cause instanceof TimeoutFailure
          ? 'timed out'
          : 'failed';
  return [`run ${run} ${how}:`, ...failureLines(err).map((l) => `  ${l}`)].join('\n');
}

/** The progress line of `wait`: step, mean reward of the last step, rollouts in flight, checkpoints. */
export function progressLine(s: RunStatus): string {
  const reward = s.rewardPerStep.length ? s.rewardPerStep[s.rewardPerStep.length - 1]!.toFixed(3) : '—';
  const completed = s.checkpoints.filter((c) => c.outcome === 'completed').length;
  const failed = s.checkpoints.filter((c) => c.outcome === 'failed').length;
  // The run keeps its last MAX_KEPT_OUTCOMES outcomes: past that the counts are of those.
  const kept = s.checkpoints.length >= MAX_KEPT_OUTCOMES ? ` of the last ${MAX_KEPT_OUTCOMES}` : '';
  return (
    `step ${s.steps}  mean reward ${reward}  in flight ${s.inFlight}  ` + `checkpoints ${completed}${failed ? ` (+${failed} failed)` : ''}${kept}  [${s.phase}]`
  );
}

/** Redraws one status line on stderr (a terminal) every 1.5 s until stopped. */
function showProgress(connection: Connection, handle: WorkflowHandle, run: string): { stop(): void } {
  const out = process.stderr;
  let stopped = false;
  let last: RunStatus | undefined;
  let problem: string | undefined;
  let timer: NodeJS.Timeout | undefined;
  const draw = (): void => {
    if (stopped) return;
    const text = `${last ? progressLine(last) : `waiting for run ${run}`}${problem ? `  (no status: ${problem})` : ''}`;
    // A wrapped line cannot be redrawn with \r: cut it to the terminal's width.
    out.write(`\r\x1b[2K${text.slice(0, Math.max(20, (out.columns || 80) - 1))}`);
  };
  const poll = async (): Promise<void> => {
    try {
      // A query waits for a worker: without one it would hang, and the line would never say so.
      last = await connection.withDeadline(Date.now() + 5_000, () => handle.query(runStatus));
      problem = undefined;
    } catch (err) {
      problem = oneLine(err instanceof Error ? err.message : String(err)).slice(0, 80);
    }
    draw();
    if (!stopped) timer = setTimeout(() => void poll(), 1_500);
  };
  draw();
  void poll();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
      out.write('\r\x1b[2K');
    },
  };
}

async function describeRun(client: Client, run: string) {
  try {
    return await client.workflow.getHandle(run).describe();
  } catch (err) {
    if (err instanceof WorkflowNotFoundError) throw new CliFailure(`no run named ${run} (namespace ${client.options.namespace})`);
    throw err;
  }
}

/** For verbs that act on a running run: a clear sentence for an unknown or finished one. */
async function requireRunning(client: Client, run: string): Promise<WorkflowExecutionDescription> {
  const d = await describeRun(client, run);
  if (d.status.name !== 'RUNNING') throw new CliFailure(`run ${run} has already finished (${d.status.name})`);
  return d;
}

/** How long a query or an update may wait for a worker to take it. */
const WORKER_WAIT_MS = 10_000;

/**
 * Runs a verb on a running run (given its task queue); a run that ended meanwhile is explained,
 * not an SDK message, and so is a query or update no worker took in time (none polls its queue).
 */
async function onRunningRun<T>(client: Client, run: string, fn: (taskQueue: string) => Promise<T>): Promise<T> {
  const { taskQueue } = await requireRunning(client, run);
  const deadlineAt = Date.now() + WORKER_WAIT_MS;
  try {
    return await client.connection.withDeadline(deadlineAt, () => fn(taskQueue));
  } catch (err) {
    if (err instanceof WorkflowNotFoundError) await requireRunning(client, run);
    // gRPC DEADLINE_EXCEEDED; or CANCELLED once the deadline has passed: the server gives up on
    // the call at the same deadline and may answer first (seen on a loaded machine).
    const code = err instanceof ServiceError ? (err.cause as { code?: number } | undefined)?.code : undefined;
    const deadline = code === 4 || (code === 1 && Date.now() >= deadlineAt - 100);
    if (deadline || err instanceof WorkflowUpdateRPCTimeoutOrCancelledError) {
      throw new CliFailure(
        `run ${run} is running, but no worker answered within ${WORKER_WAIT_MS / 1000} s: is a worker (npm run worker) polling its task queue ${taskQueue}?`,
      );
    }
    throw err;
  }
}

async function waitForRun(client: Client, connection: Connection, run: string): Promise<void> {
  const d = await describeRun(client, run);
  const handle = client.workflow.getHandle(run);
  const progress = process.stderr.isTTY && d.status.name === 'RUNNING' ? showProgress(connection, handle, run) : undefined;
  let summary: unknown;
  try {
    summary = await handle.result();
  } catch (err) {
    if (err instanceof WorkflowFailedError) throw new CliFailure(runFailureText(run, err));
    throw err;
  } finally {
    progress?.stop();
  }
  console.log(JSON.stringify(summary, null, 2));
}

async function main(argv: string[]): Promise<void> {
  const { values, verb, args } = parseCommandLine(RUN_CLI, argv);
  const arg = args[0]!;
  const timeoutS = values['connect-timeout-s'] === undefined ? 2 : Number(values['connect-timeout-s']);
  if (!(timeoutS > 0)) exitWithUsageError(RUN_CLI, '--connect-timeout-s must be a positive number of seconds');
  const target = targetOf(values.address, process.env);
  const namespace = values.namespace ?? 'default';
  // A bad config fails before any connection is tried.
  const config = verb === 'start' ? loadRunConfig(arg) : undefined;
  const connection = await connectWithin(target, timeoutS * 1000);
  const client = new Client({ connection, namespace });
  try {
    switch (verb) {
      case 'start': {
        const handle = await startRun(client, config!).catch(async (err: unknown) => {
          if (err instanceof WorkflowExecutionAlreadyStartedError) throw await takenNameFailure(client, config!.run.name);
          throw err;
        });
        console.log(`started run ${handle.workflowId} (run id ${handle.firstExecutionRunId})`);
        break;
      }
      case 'status':
        console.log(JSON.stringify(await onRunningRun(client, arg, () => client.workflow.getHandle(arg).query(runStatus)), null, 2));
        break;
      case 'checkpoint-now': {
        // Only its acceptance is bounded: the checkpoint itself may take minutes.
        const update = await onRunningRun(client, arg, () =>
          client.workflow.getHandle(arg).startUpdate(checkpointNow, { waitForStage: WorkflowUpdateStage.ACCEPTED }),
        );
        console.log(JSON.stringify(await update.result(), null, 2));
        break;
      }
      case 'stop':
        await onRunningRun(client, arg, () => client.workflow.getHandle(arg).signal(stopRun));
        console.log(`asked run ${arg} to stop`);
        break;
      case 'wait':
        await waitForRun(client, connection, arg);
        break;
    }
  } catch (err) {
    if (err instanceof NamespaceNotFoundError) throw new CliFailure(`no namespace ${namespace} on the Temporal server at ${target.address} (${target.source})`);
    throw err;
  } finally {
    await connection.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    if (err instanceof ConfigError) {
      console.error(`run: config error: ${err.message}`);
      process.exit(2);
    }
    if (err instanceof CliFailure || err instanceof ConnectFailure) console.error(`run: ${err.message}`);
    else console.error(`run: ${failureLines(err).join('\n  ')}`);
    process.exit(1);
  });
}
