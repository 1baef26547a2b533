// The workflow bundle's entry: every workflow type the worker registers.
export { trainingRun } from './trainingRun.js';
export { checkpointAttempt } from './checkpointAttempt.js';
export { rolloutAttempt } from './rolloutAttempt.js';
export { rolloutShard } from './rolloutShard.js';
