// The workflow of bench/heartbeat-load.ts: one activity that parks, heartbeating, like a `/run`.
import { proxyActivities } from '@temporalio/workflow';

export async function parkedRollout(heartbeatTimeoutS: number): Promise<void> {
  const { park } = proxyActivities<{ park(): Promise<void> }>({ startToCloseTimeout: '1 hour', heartbeatTimeout: `${heartbeatTimeoutS} seconds` });
  await park();
}
