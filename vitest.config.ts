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

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // The Temporal native addon and worker threads do not mix (sdk-typescript #876).
    pool: 'forks',
    // Worker creation and workflow bundling take seconds; starting servers takes more.
    testTimeout: 60_000,
    hookTimeout: 180_000,
    // Two cores: one file (and its servers) at a time.
    fileParallelism: false,
    sequence: { sequencer: LlamaLastSequencer },
  },
});
