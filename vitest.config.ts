import { defineConfig } from 'vitest/config';

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
  },
});
