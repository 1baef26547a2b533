// The workflow bundle's module graph is evaluated again for every workflow the worker creates
// (the SDK isolates module state per workflow), so a rollout attempt pays for every module the
// workflows import. zod alone cost ~4 ms of worker CPU per rollout: workflow code imports the
// zod-free protocol modules only.
import { describe, expect, it } from 'vitest';
import { bundleWorkflows } from '../../worker.js';

describe('workflow bundle', () => {
  it('holds no zod and none of the schema modules', async () => {
    const { code } = await bundleWorkflows();
    const modules = [...new Set([...code.matchAll(/^\/\*{3}\/ "(\.\/[^"]+)"$/gm)].map((m) => m[1]!))];
    expect(modules).toContain('./workflows/rolloutAttempt.ts');
    expect(modules.filter((m) => m.includes('node_modules/zod'))).toEqual([]);
    expect(modules.filter((m) => m.startsWith('./protocol/'))).toEqual(expect.arrayContaining(['./protocol/episode-id.ts']));
    expect(modules).not.toContain('./protocol/ids.ts');
  }, 60_000);
});
