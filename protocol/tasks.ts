// Tasks and the environment `/run` bodies (participants.md §2.2–2.3), the `[task …]` line the
// tiny policy reads (docs/gym-servers.md "Tasks"), and the task digest (control-plane.md §9.6).
import { refuse } from './errors.js';
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { canonicalJson } from './canonical-json.js';
import { EpisodeIdSchema } from './ids.js';

// --- /run request -----------------------------------------------------------------------

export const TaskIdSchema = z.strictObject({
  taskset: z.string().min(1),
  task_id: z.string().min(1),
});
export type TaskId = z.infer<typeof TaskIdSchema>;

/** Open: the agent's Responses-style create params (`input`, `tools`, and anything else). */
export const ResponsesCreateParamsSchema = z.looseObject({
  input: z.union([z.string(), z.array(z.unknown())]),
  tools: z.array(z.unknown()).optional(),
});

export const TaskInputSchema = z.strictObject({
  responses_create_params: ResponsesCreateParamsSchema,
  // Defaults are filled in before a digest is taken, as Gym digests the parsed model.
  task_data: z.record(z.string(), z.unknown()).default({}),
  agent_timeout_seconds: z.number().positive().nullable().default(null),
});

/** Closed at every level except inside `responses_create_params` and `task_data`. */
export const TaskSchema = z.strictObject({
  task_id: TaskIdSchema,
  task_input: TaskInputSchema,
});
export type Task = z.infer<typeof TaskSchema>;

/** `SingleAgentTurnRequest`. */
/** Ours: the header a controller sets on `/run` with the environment's `instance_id` it discovered. */
export const INSTANCE_HEADER = 'x-ng-instance-id';

/** Refuses a `/run` dispatched to an earlier process of this environment server (it restarted since). */
export function assertExpectedInstance(expected: string | string[] | undefined, actual: string): void {
  if (typeof expected === 'string' && expected !== actual)
    throw refuse('instance_mismatch', `this is environment process ${actual}, not ${expected} (it restarted)`);
}

export const RunRequestSchema = z.strictObject({
  episode_id: EpisodeIdSchema,
  task: TaskSchema,
});
export type RunRequest = z.infer<typeof RunRequestSchema>;

// --- /run reply (read leniently: extra keys are kept) -----------------------------------

export const FAILURE_STAGES = ['admission', 'seed', 'agent', 'verification', 'cleanup'] as const;
export type FailureStage = (typeof FAILURE_STAGES)[number];

/** The resources server's verify reply (extra keys preserved) plus the agent's observations. */
export const RunResultSchema = z.looseObject({
  responses_create_params: z.unknown().optional(),
  response: z.unknown().optional(),
  reward: z.number(),
  mask_sample: z.boolean().optional(),
  ng_agent_observations: z.unknown().optional(),
  ng_trajectory: z.unknown().optional(),
  agent_timed_out: z.boolean().optional(),
  agent_timeout_seconds: z.number().nullable().optional(),
  failure_kind: z.string().nullable().optional(),
  failure_reason: z.string().nullable().optional(),
});
export type RunResult = z.infer<typeof RunResultSchema>;

export const RunFailureSchema = z.looseObject({
  failure_reason: z.string().max(2000),
  terminal: z.boolean(),
  stage: z.enum(FAILURE_STAGES).optional(),
  failure_kind: z.string().optional(),
  partial_response: z.unknown().optional(),
  ng_agent_observations: z.unknown().optional(),
  ng_trajectory: z.unknown().optional(),
  cleanup_error: z.unknown().optional(),
});
export type RunFailure = z.infer<typeof RunFailureSchema>;

/** `SingleAgentTurnResponse`: exactly one of `result` and `failure` is non-null. */
export const RunReplySchema = z
  .looseObject({
    episode_id: EpisodeIdSchema,
    task_id: TaskIdSchema,
    result: RunResultSchema.nullable().default(null),
    failure: RunFailureSchema.nullable().default(null),
  })
  .refine((r) => (r.result === null) !== (r.failure === null), 'exactly one of result and failure must be non-null');
export type RunReply = z.infer<typeof RunReplySchema>;

// --- the task digest ----------------------------------------------------------------------

/** Lowercase hex SHA-256 of the task's canonical JSON; a replacement `/run` must match it. */
export function taskDigest(task: Task): string {
  return createHash('sha256').update(canonicalJson(task), 'utf8').digest('hex');
}

// --- the tasksets and the `[task …]` line -----------------------------------------------

export const TASKSETS = ['counter', 'weather', 'genrm'] as const;
export type Taskset = (typeof TASKSETS)[number];

/** City codes (no spaces, so they fit the task line). */
export const CITIES = ['SF', 'NYC', 'LA', 'Seattle', 'Boston', 'Paris', 'London', 'Tokyo', 'Berlin', 'Sydney'] as const;

/** Topics of the genrm prompts; prompt `p<k>` asks about topic `k mod GENRM_TOPICS.length`. */
export const GENRM_TOPICS = [
  'photosynthesis',
  'ocean tides',
  'rainbows',
  'inflation',
  'vaccines',
  'compound interest',
  'the seasons',
  'recursion',
  'hash tables',
  'plate tectonics',
  'the water cycle',
  'supply and demand',
] as const;

export function genrmPromptId(k: number): string {
  return `p${k}`;
}

/** The topic of a genrm prompt ID (`p17` → GENRM_TOPICS[5]); undefined for a malformed ID. */
export function genrmTopicIndex(promptId: string): number | undefined {
  const m = /^p(0|[1-9][0-9]*)$/.exec(promptId);
  if (!m) return undefined;
  const k = Number(m[1]);
  return Number.isSafeInteger(k) ? k % GENRM_TOPICS.length : undefined;
}

export type TaskLine = { taskset: 'counter'; start: number; target: number } | { taskset: 'weather'; city: string } | { taskset: 'genrm'; prompt: string };

export function renderTaskLine(t: TaskLine): string {
  switch (t.taskset) {
    case 'counter':
      return `[task counter start=${t.start} target=${t.target}]`;
    case 'weather':
      return `[task weather city=${t.city}]`;
    case 'genrm':
      return `[task genrm prompt=${t.prompt}]`;
  }
}

const TASK_LINE = /\[task ([a-z_]+)((?: +[a-z_]+=[^\s\]]+)*) *\]/g;
const INT = /^-?(0|[1-9][0-9]*)$/;

/** The last well-formed `[task …]` line in `text`, or undefined. */
export function parseTaskLine(text: string): TaskLine | undefined {
  let found: TaskLine | undefined;
  for (const m of text.matchAll(TASK_LINE)) {
    const fields = new Map<string, string>();
    for (const kv of m[2]!.trim().split(/ +/).filter(Boolean)) {
      const eq = kv.indexOf('=');
      fields.set(kv.slice(0, eq), kv.slice(eq + 1));
    }
    const line = taskLineOf(m[1]!, fields);
    if (line) found = line;
  }
  return found;
}

function taskLineOf(taskset: string, f: Map<string, string>): TaskLine | undefined {
  if (taskset === 'counter') {
    const start = f.get('start');
    const target = f.get('target');
    if (!start || !target || !INT.test(start) || !INT.test(target)) return undefined;
    return { taskset, start: Number(start), target: Number(target) };
  }
  if (taskset === 'weather') {
    const city = f.get('city');
    return city ? { taskset, city } : undefined;
  }
  if (taskset === 'genrm') {
    const prompt = f.get('prompt');
    return prompt ? { taskset, prompt } : undefined;
  }
  return undefined;
}
