import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * The llama.cpp tests last: on a fresh clone they wait for the bootstrap's background build of
 * llama.cpp, which compiles while every other file runs instead of holding them up.
 */
class LlamaLastSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const llama = (f: TestSpecification): boolean => /[/\\]test[/\\]e2e[/\\]llama[/\\]/.test(f.moduleId);
    return [...sorted.filter((f) => !llama(f)), ...sorted.filter(llama)];
  }
}

/**
 * Two lanes on two cores, one file at a time in each: the end-to-end files (each starts a Temporal
 * dev server, Gym processes and a worker) never run beside one another, and the rest (unit,
 * contract, in-process servers, time-skipping workflow tests) runs beside them: much of an e2e
 * file's time is spent waiting on its processes, and the other lane uses the cores meanwhile.
 */
const E2E = 'test/e2e/**/*.test.ts';

export default defineConfig({
  test: {
    // The Temporal native addon and worker threads do not mix (sdk-typescript #876).
    pool: 'forks',
    // One fork per lane.
    maxWorkers: 2,
    // Worker creation and workflow bundling take seconds; starting servers takes more.
    testTimeout: 60_000,
    hookTimeout: 180_000,
    sequence: { sequencer: LlamaLastSequencer },
    projects: [
      { extends: true, test: { name: 'e2e', include: [E2E], fileParallelism: false } },
      { extends: true, test: { name: 'rest', include: ['test/**/*.test.ts'], exclude: [E2E], fileParallelism: false } },
    ],
  },
});
