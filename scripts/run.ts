// The client script of the controller:
//   npm run run -- start <config.yaml>      start a training run (workflow ID = run.name)
//   npm run run -- status <run>             the run's status (a query)
//   npm run run -- checkpoint-now <run>     take a checkpoint now (an update; prints its outcome)
//   npm run run -- stop <run>               stop dispatching, finish what is in flight
//   npm run run -- wait <run>               wait for the run's result
// Temporal address from --address or TEMPORAL_ADDRESS (default 127.0.0.1:7233).
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { Client, Connection } from '@temporalio/client';
import { parse as parseYaml } from 'yaml';
import { RunConfigSchema, type RunConfig } from '../protocol/run-config.js';
import { ConfigError, parseConfig } from '../servers/common/config-error.js';
import { checkpointNow, runStatus, stopRun } from '../workflows/messages.js';
import { trainingRun } from '../workflows/trainingRun.js';

export function loadRunConfig(file: string): RunConfig {
  let raw: unknown;
  try {
    raw = parseYaml(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(file, `cannot read run config: ${(err as Error).message}`);
  }
  return parseConfig(RunConfigSchema, raw, '');
}

export async function startRun(client: Client, config: RunConfig) {
  return client.workflow.start(trainingRun, {
    workflowId: config.run.name,
    taskQueue: config.run.task_queue,
    args: [{ config }],
    staticSummary: `training run ${config.run.name}`,
    staticDetails:
      `${config.grpo.max_num_steps} steps × ${config.grpo.num_prompts_per_step} prompts × ${config.grpo.num_generations_per_prompt} generations ` +
      `over ${config.grpo.tasksets.join(', ')}; checkpoints every ${config.rollout_checkpointing.snapshot_attempt_interval_s ?? '—'} s into \`${config.run.checkpoint_dir}\``,
    memo: { run: config.run.name },
  });
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { address: { type: 'string', default: process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233' }, namespace: { type: 'string', default: 'default' } },
  });
  const [command, arg] = positionals;
  if (!command || !arg) {
    console.error('usage: run.ts start <config.yaml> | status <run> | checkpoint-now <run> | stop <run> | wait <run>');
    process.exit(2);
  }
  const connection = await Connection.connect({ address: values.address! });
  const client = new Client({ connection, namespace: values.namespace });
  try {
    switch (command) {
      case 'start': {
        const config = loadRunConfig(arg);
        const handle = await startRun(client, config);
        console.log(`started run ${handle.workflowId} (run id ${handle.firstExecutionRunId})`);
        break;
      }
      case 'status':
        console.log(JSON.stringify(await client.workflow.getHandle(arg).query(runStatus), null, 2));
        break;
      case 'checkpoint-now':
        console.log(JSON.stringify(await client.workflow.getHandle(arg).executeUpdate(checkpointNow), null, 2));
        break;
      case 'stop':
        await client.workflow.getHandle(arg).signal(stopRun);
        console.log(`asked run ${arg} to stop`);
        break;
      case 'wait':
        console.log(JSON.stringify(await client.workflow.getHandle(arg).result(), null, 2));
        break;
      default:
        console.error(`unknown command '${command}'`);
        process.exit(2);
    }
  } finally {
    await connection.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    if (err instanceof ConfigError) {
      console.error(`config error: ${err.message}`);
      process.exit(2);
    }
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
