// Smoke-test workflows only; product workflows live in workflows/.
import { proxyActivities, sleep } from '@temporalio/workflow';
import type * as activities from './activities.js';

const { greet } = proxyActivities<typeof activities>({ startToCloseTimeout: '10 seconds' });

/** Sleeps an hour of workflow time; returns how much workflow time passed, in ms. */
export async function sleepAnHour(): Promise<number> {
  const start = Date.now();
  await sleep('1 hour');
  return Date.now() - start;
}

export async function greetOnce(name: string): Promise<string> {
  return await greet(name);
}
