// Deterministic orchestration only: the activity does the work.
import { proxyActivities } from '@temporalio/workflow';
import type * as activities from './activities.js';

const { composeGreeting } = proxyActivities<typeof activities>({ startToCloseTimeout: '10 seconds' });

export async function hello(name: string): Promise<string> {
  return await composeGreeting(name);
}
