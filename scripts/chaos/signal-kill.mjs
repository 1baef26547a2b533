// Loaded into the chaos worker process (`node --import`): the faults a schedule cannot time from
// outside, because their windows are a few milliseconds inside the worker. Once armed (the file
// named by CHAOS_KILL_FILE exists, holding what to wait for), the process SIGKILLs itself right
// after the next signal of that kind reached the server (the first line names it):
//   report  completed reports (`rolloutsFinished`): the shard has sealed those attempts, and the
//           activities that sent them never complete, so the server retries them on the next worker
//           (chaos seed 648);
//   cut     a checkpoint attempt's candidates request to a shard, before the attempt's workflow task
//           that sent it completed: the next worker answers it (the shard writes its cut into the
//           temp snapshot) and runs that task's local activities again (the allocation among them);
//   release a checkpoint attempt's release of the shards' holds (`setHolds`) once it published its
//           snapshot (in the checkpoint directory on the arm file's second line, since arming):
//           after its publication and Gym's resume, before its workflow task completed, so the
//           next worker runs the stages before publication again (they fail against what is done:
//           the temp snapshot renamed, Gym resumed the ID).
// Fault injection for `npm run chaos` only: nothing in the product loads it.
import { readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Context } from '@temporalio/activity';
import { WorkflowClient } from '@temporalio/client';

const armFile = process.env.CHAOS_KILL_FILE;

const listing = (dir) => {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
};

/** The checkpoint ID of the attempt whose (local) activity sends the signal; undefined for any other sender. */
function sendingCheckpoint() {
  try {
    return /\/checkpoint\/([^/]+)$/.exec(Context.current().info.workflowExecution.workflowId)?.[1];
  } catch {
    return undefined; // not inside an activity
  }
}

/** Whether `checkpointId` published its snapshot under `checkpointDir` at `sinceMs` or later (its manifest names it). */
function publishedSince(checkpointDir, checkpointId, sinceMs) {
  for (const anchor of listing(checkpointDir)) {
    const root = join(checkpointDir, anchor, 'rollout_snapshots');
    for (const name of listing(root).filter((n) => /^snapshot_\d+$/.test(n))) {
      const file = join(root, name, 'manifest.json');
      const manifest = statSync(file, { throwIfNoEntry: false });
      if (manifest && manifest.mtimeMs >= sinceMs && JSON.parse(readFileSync(file, 'utf8')).checkpoint_id === checkpointId) return true;
    }
  }
  return false;
}

/** What the signal carried, for the log line; undefined when it is not the one armed for. */
function armedFor([trigger, checkpointDir], armedAtMs, input) {
  const [arg] = input.args ?? [];
  if (trigger === 'report' && input.signalName === 'rolloutsFinished') {
    return `the completed reports of ${(arg ?? []).map((r) => r.captureKey).join(', ')}`;
  }
  if (trigger === 'cut' && input.signalName === 'shardRequest' && arg?.kind === 'candidates') {
    return `the candidates request ${arg.id}`;
  }
  const checkpoint = trigger === 'release' && input.signalName === 'setHolds' ? sendingCheckpoint() : undefined;
  if (checkpoint !== undefined && publishedSince(checkpointDir, checkpoint, armedAtMs)) {
    return `holds ${JSON.stringify(arg?.admission ?? arg)} (the release of ${checkpoint}, published)`;
  }
  return undefined;
}

if (armFile) {
  // The last step of the client's signal chain (below the interceptors): every signal goes through it.
  const send = WorkflowClient.prototype._signalWorkflowHandler;
  if (typeof send !== 'function') throw new Error('signal-kill: @temporalio/client has no _signalWorkflowHandler to wrap (the SDK changed)');
  WorkflowClient.prototype._signalWorkflowHandler = async function (input) {
    const sent = await send.call(this, input);
    const armed = statSync(armFile, { throwIfNoEntry: false });
    const lines = armed ? readFileSync(armFile, 'utf8').trim().split('\n') : undefined;
    const what = lines === undefined ? undefined : armedFor(lines, armed.mtimeMs, input);
    if (what !== undefined) {
      rmSync(armFile, { force: true });
      // Pipes are written synchronously on Linux: the line is in the log before the kill.
      console.error(`${lines[0]}-kill: SIGKILL right after sending ${what} to ${input.workflowExecution?.workflowId}`);
      process.kill(process.pid, 'SIGKILL');
    }
    return sent;
  };
}
