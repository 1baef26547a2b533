// A training run's configuration (examples/run.yaml), validated by the client script before the
// run starts; workflows receive the parsed object. Closed objects: an unknown key fails naming it.
import { z } from 'zod';

const positive = z.number().positive().finite();
const TargetLevelSchema = z.enum(['turn', 'sibling', 'prompt_group']);

export const RunConfigSchema = z.strictObject({
  run: z.strictObject({
    /** Workflow ID of the training run; child IDs derive from it. */
    name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, 'run.name must match ^[A-Za-z0-9][A-Za-z0-9._-]*$'),
    /** Run directory of the Gym deployment (`npm run gym -- up … --dir <run dir>`). */
    gym_run_dir: z.string().min(1),
    checkpoint_dir: z.string().min(1),
    seed: z.number().int().default(1),
    task_queue: z.string().default('rollout-control'),
    rollout_task_queue: z.string().default('rollout-run'),
  }),
  grpo: z
    .strictObject({
      num_prompts_per_step: z.number().int().min(1).default(4),
      num_generations_per_prompt: z.number().int().min(1).default(4),
      max_num_steps: z.number().int().min(1).default(10),
      tasksets: z
        .array(z.enum(['counter', 'weather', 'genrm']))
        .min(1)
        .default(['counter', 'weather']),
      /** Environment server per taskset (server names of the Gym deployment). */
      environments: z.record(z.string(), z.string()).default({ counter: 'counter_env', weather: 'weather_env', genrm: 'genrm_env' }),
    })
    .default({
      num_prompts_per_step: 4,
      num_generations_per_prompt: 4,
      max_num_steps: 10,
      tasksets: ['counter', 'weather'],
      environments: { counter: 'counter_env', weather: 'weather_env', genrm: 'genrm_env' },
    }),
  async_rl: z
    .strictObject({
      /** Prompt groups in flight at once. */
      max_in_flight_groups: z.number().int().min(1).default(8),
      rollout_timeout_s: positive.nullable().default(null),
      max_attempts_per_sibling: z.number().int().min(1).default(3),
    })
    .default({ max_in_flight_groups: 8, rollout_timeout_s: null, max_attempts_per_sibling: 3 }),
  rollout_checkpointing: z
    .strictObject({
      snapshot_attempt_interval_s: positive.nullable().default(null),
      max_consecutive_failures: z.number().int().min(1).default(3),
      keep_latest_k: z.number().int().min(1).default(2),
      restore_mode: z.enum(['latest', 'none']).default('latest'),
      gym: z
        .strictObject({
          prepare_timeout_s: positive.default(300),
          require_model_participant: z.boolean().default(false),
        })
        .default({ prepare_timeout_s: 300, require_model_participant: false }),
    })
    .default({
      snapshot_attempt_interval_s: null,
      max_consecutive_failures: 3,
      keep_latest_k: 2,
      restore_mode: 'latest',
      gym: { prepare_timeout_s: 300, require_model_participant: false },
    }),
  checkpointing: z
    .strictObject({
      /** Trainer checkpoints (anchors) every `save_period` steps, each followed by a Gym-aware snapshot. */
      enabled: z.boolean().default(true),
      save_period: z.number().int().min(1).default(1),
    })
    .default({ enabled: true, save_period: 1 }),
  trainer: z
    .preprocess(
      // `trainer: none` is short for `trainer: { kind: none }`.
      (v) => (typeof v === 'string' ? { kind: v } : v),
      z.strictObject({
        /**
         * `tiny_grpo`: a GRPO step of the tiny policy per batch, trainer anchors, a refit of the
         * inference backend. `none`: no training, no refit, no anchors: each step's batch is
         * appended to `<checkpoint_dir>/rollout_batches.jsonl` for an external trainer
         * (activities/rollout-batches.ts). `external`: a trainer of its own (NeMo RL, verl) plays
         * the trainer role through activities it registers (activities/trainer-role.ts).
         */
        kind: z.enum(['tiny_grpo', 'none', 'external']).default('tiny_grpo'),
        /** Call the trainer at all (off: steps only count groups). */
        enabled: z.boolean().default(true),
      }),
    )
    .default({ kind: 'tiny_grpo', enabled: true }),
  rollout_recovery: z
    .strictObject({
      target_level: TargetLevelSchema.default('turn'),
      /** Exact Gym agent name → a coarser level for its environments (checked against discovery at setup). */
      agent_target_level_overrides: z.record(z.string(), TargetLevelSchema).default({}),
      /** Task source (taskset) → a coarser level for its environment. */
      task_source_target_level_overrides: z.record(z.string(), TargetLevelSchema).default({}),
    })
    .default({ target_level: 'turn', agent_target_level_overrides: {}, task_source_target_level_overrides: {} }),
  controller: z
    .strictObject({
      /** Continue-as-new once the run's history has this many events (below the server's limits). */
      max_history_events: z.number().int().min(200).default(8_000),
      /** How long the ledger cut waits for `/run` replies already on the wire (ms). */
      late_result_wait_ms: z.number().int().min(0).default(3_000),
      /**
       * Heartbeat timeout of each `/run` activity, at least: how long a dead worker's rollouts go
       * unnoticed before they are retried elsewhere. Each held `/run` is beaten (a write on the
       * server) once per half to 0.7 of it; the run raises it for a large window (below).
       */
      run_heartbeat_timeout_s: z.number().min(5).max(3_600).default(120),
      /**
       * The heartbeats of the run's `/run`s together, at most, a second: with a window of W rollouts
       * the heartbeat timeout is at least W / (0.5 × this) s (16,000 in flight at 50 a second: 640 s).
       */
      run_heartbeats_per_s: z.number().min(1).max(10_000).default(50),
      /**
       * How long a recovery waits for every Gym participant to answer again after a crash (retried
       * with backoff, the run's status says so); past it the run fails with `gym_unavailable`.
       */
      gym_recovery_timeout_s: z.number().min(10).max(86_400).default(600),
      /**
       * Rollout attempts in flight per rollout shard (the workflows that start the attempts and
       * batch their reports): the run has ceil(max_in_flight_groups × num_generations_per_prompt / this)
       * shards. A shard carries its attempts' ledger slice across continue-as-new (~185 KB at
       * 1,000), and a checkpoint asks every shard for its part, so fewer, fuller shards close
       * admission for less time (docs/performance.md).
       */
      rollouts_per_shard: z.number().int().min(1).max(1_000).default(1_000),
      /**
       * How long an activity's task may wait for a worker before it is scheduled again: the server
       * can lose a task in a restart, and nothing else would ever time it out. Also how often a
       * `/run` queued behind a full rollout worker is re-queued, so keep it well above a rollout's
       * usual wait for a slot.
       */
      schedule_to_start_timeout_s: z.number().min(1).max(86_400).default(120),
    })
    .default({
      max_history_events: 8_000,
      late_result_wait_ms: 3_000,
      run_heartbeat_timeout_s: 120,
      run_heartbeats_per_s: 50,
      gym_recovery_timeout_s: 600,
      rollouts_per_shard: 1_000,
      schedule_to_start_timeout_s: 120,
    }),
});

export type RunConfig = z.infer<typeof RunConfigSchema>;
