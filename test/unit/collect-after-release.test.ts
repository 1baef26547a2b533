// The commit's garbage collected after the release (servers/control/collect-after-release.ts).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it, vi } from 'vitest';
import { collectAfterRelease, exposedCollector } from '../../servers/control/collect-after-release.js';

describe('collectAfterRelease', () => {
  it('collects once, after the delay, while no checkpoint opened', async () => {
    const collect = vi.fn();
    expect(collectAfterRelease(() => true, collect, 20)).toBe(true);
    expect(collect).not.toHaveBeenCalled(); // not in the resume's own turn: its reply goes first
    await sleep(60);
    expect(collect).toHaveBeenCalledTimes(1);
  });

  it('skips the collection when a checkpoint opened before it was due', async () => {
    const collect = vi.fn();
    let idle = true;
    collectAfterRelease(() => idle, collect, 20);
    idle = false;
    await sleep(60);
    expect(collect).not.toHaveBeenCalled();
  });

  it('does nothing in a process without --expose-gc', () => {
    expect(exposedCollector()).toBeUndefined(); // vitest's workers run without it
    expect(collectAfterRelease(() => true, undefined, 20)).toBe(false);
  });
});
