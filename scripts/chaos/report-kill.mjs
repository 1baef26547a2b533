// Loaded into the chaos worker process (`node --import`): the one fault a schedule cannot time from
// outside, because its window is a few milliseconds inside the worker. Once armed (the file named
// by CHAOS_REPORT_KILL_FILE exists), the process SIGKILLs itself right after its next batch of
// completed reports (`rolloutsFinished`) reached the server: the shard has sealed those attempts,
// and the activities that sent them never complete, so the server retries them on the next worker
// (chaos seed 648). Fault injection for `npm run chaos` only: nothing in the product loads it.
import { existsSync, rmSync } from 'node:fs';
import { WorkflowClient } from '@temporalio/client';

const armFile = process.env.CHAOS_REPORT_KILL_FILE;
if (armFile) {
  // The last step of the client's signal chain (below the interceptors): every signal goes through it.
  const send = WorkflowClient.prototype._signalWorkflowHandler;
  if (typeof send !== 'function') throw new Error('report-kill: @temporalio/client has no _signalWorkflowHandler to wrap (the SDK changed)');
  WorkflowClient.prototype._signalWorkflowHandler = async function (input) {
    const sent = await send.call(this, input);
    if (input.signalName === 'rolloutsFinished' && existsSync(armFile)) {
      rmSync(armFile, { force: true });
      const keys = (input.args?.[0] ?? []).map((r) => r.captureKey).join(', ');
      // Pipes are written synchronously on Linux: the line is in the log before the kill.
      console.error(`report-kill: SIGKILL right after sending the completed reports of ${keys} to ${input.workflowExecution?.workflowId}`);
      process.kill(process.pid, 'SIGKILL');
    }
    return sent;
  };
}
