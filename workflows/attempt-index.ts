// The rollout worker's workflow bundle: only the rollout attempt. Its workflows run beside their
// own `/run` activities (eager dispatch, no second queue), and a bundle without the run, the shard
// and the checkpoint attempt is less code for the SDK to evaluate for each of the thousands of
// attempts it creates.
export { rolloutAttempt } from './rolloutAttempt.js';
