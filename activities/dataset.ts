// The task dataset and its dataloader (docs/gym-servers.md "Tasks"). Pure and deterministic: task
// `i` of seed `s` is a function of (s, i) alone, so a dataloader cursor (the next prompt index) is
// all it takes to resume after a crash.
import { createHash } from 'node:crypto';
import type { ResponsesFunctionTool } from '../protocol/openai.js';
import { CITIES, GENRM_TOPICS, TASKSETS, genrmPromptId, genrmTopicIndex, renderTaskLine, type Task, type TaskLine, type Taskset } from '../protocol/tasks.js';

export const SYSTEM_PROMPT = 'You are a helpful assistant.';
/** genrm prompt IDs are `p0` … `p<GENRM_PROMPT_COUNT - 1>` (topics repeat every 12). */
export const GENRM_PROMPT_COUNT = 48;

export const COUNTER_TOOLS: ResponsesFunctionTool[] = [
  {
    type: 'function',
    name: 'increment_counter',
    description: 'Add count to the session counter.',
    parameters: { type: 'object', properties: { count: { type: 'integer' } }, required: ['count'], additionalProperties: false },
  },
  {
    type: 'function',
    name: 'get_counter_value',
    description: 'Read the session counter.',
    parameters: { type: 'object', properties: {}, additionalProperties: false },
  },
];

export const WEATHER_TOOLS: ResponsesFunctionTool[] = [
  {
    type: 'function',
    name: 'get_weather',
    description: 'Get the current weather of a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
  },
];

export interface GenerateTasksOptions {
  seed: number;
  count: number;
  /** Which tasksets, interleaved in this order (default all three). */
  tasksets?: readonly Taskset[];
}

function checkInt(name: string, v: number, min: number): void {
  if (!Number.isSafeInteger(v) || v < min) throw new RangeError(`${name} must be an integer ≥ ${min} (got ${v})`);
}

function checkTasksets(tasksets: readonly Taskset[]): void {
  if (!tasksets.length) throw new RangeError('tasksets must not be empty');
  for (const t of tasksets) if (!TASKSETS.includes(t)) throw new RangeError(`unknown taskset '${t}'`);
}

/** Task `index` of the dataset with this seed (tasksets interleaved round-robin). */
export function taskAt(seed: number, index: number, tasksets: readonly Taskset[] = TASKSETS): Task {
  checkInt('seed', seed, 0);
  checkInt('index', index, 0);
  checkTasksets(tasksets);
  const taskset = tasksets[index % tasksets.length]!;
  const h = createHash('sha256').update(`dataset:${seed}:${index}`).digest();
  const line: TaskLine =
    taskset === 'counter'
      ? counterLine(h.readUInt32BE(0) % 6, 2 + (h.readUInt32BE(4) % 5))
      : taskset === 'weather'
        ? { taskset, city: CITIES[h.readUInt32BE(0) % CITIES.length]! }
        : { taskset, prompt: genrmPromptId(h.readUInt32BE(0) % GENRM_PROMPT_COUNT) };
  return taskOf(line, `${taskset}-${seed}-${index}`);
}

function counterLine(start: number, gap: number): TaskLine {
  return { taskset: 'counter', start, target: start + gap };
}

/** The task for a task line: user prompt ending in the line, the taskset's tools and task_data. */
export function taskOf(line: TaskLine, taskId: string): Task {
  let prompt: string;
  let tools: ResponsesFunctionTool[];
  let taskData: Record<string, unknown>;
  switch (line.taskset) {
    case 'counter':
      prompt = `The counter starts at ${line.start}. Use the tools to bring it to exactly ${line.target}, then tell me you are done.`;
      tools = COUNTER_TOOLS;
      taskData = { initial_count: line.start, expected_count: line.target };
      break;
    case 'weather':
      prompt = `How is the weather in ${line.city}?`;
      tools = WEATHER_TOOLS;
      taskData = { city: line.city };
      break;
    case 'genrm': {
      const topic = GENRM_TOPICS[genrmTopicIndex(line.prompt) ?? 0];
      prompt = `Explain ${topic} in one or two sentences.`;
      tools = [];
      taskData = { prompt_id: line.prompt };
      break;
    }
  }
  return {
    task_id: { taskset: line.taskset, task_id: taskId },
    task_input: {
      responses_create_params: {
        input: [
          { role: 'developer', content: SYSTEM_PROMPT },
          { role: 'user', content: `${prompt}\n${renderTaskLine(line)}` },
        ],
        tools: structuredClone(tools),
      },
      task_data: taskData,
      agent_timeout_seconds: null,
    },
  };
}

export function generateTasks({ seed, count, tasksets = TASKSETS }: GenerateTasksOptions): Task[] {
  checkInt('count', count, 0);
  return Array.from({ length: count }, (_, i) => taskAt(seed, i, tasksets));
}

// --- the dataloader ---------------------------------------------------------------------

/** One prompt and the number of siblings (GRPO group) that will run it. */
export interface PromptGroup {
  /** Stable per prompt group; siblings' rollout IDs are built from it. */
  group_id: string;
  /** The dataset index of the prompt (the cursor position it was pulled from). */
  prompt_index: number;
  size: number;
  /** The unstamped task; each sibling runs `siblingTask(group, k)`. */
  task: Task;
}

export interface PromptGroupsOptions {
  seed: number;
  /** The next prompt index to pull (0 for a fresh run). */
  cursor: number;
  groups: number;
  groupSize: number;
  tasksets?: readonly Taskset[];
}

export interface PromptBatch {
  groups: PromptGroup[];
  /** The cursor after this batch: pass it back to pull the next one. */
  cursor: number;
}

export function groupIdOf(seed: number, promptIndex: number): string {
  return `s${seed}-p${promptIndex}`;
}

export function promptGroups({ seed, cursor, groups, groupSize, tasksets = TASKSETS }: PromptGroupsOptions): PromptBatch {
  checkInt('cursor', cursor, 0);
  checkInt('groups', groups, 0);
  checkInt('groupSize', groupSize, 1);
  const out: PromptGroup[] = [];
  for (let i = cursor; i < cursor + groups; i++) {
    out.push({ group_id: groupIdOf(seed, i), prompt_index: i, size: groupSize, task: taskAt(seed, i, tasksets) });
  }
  return { groups: out, cursor: cursor + groups };
}

export interface GroupMember {
  groupId: string;
  rolloutIndex: number;
  /** Bumped when a whole cohort is relaunched (prompt-group recovery); default 0. */
  groupAttempt?: number;
}

/**
 * A genrm task stamped for one cohort member (`_ng_group_id`, `_ng_group_attempt`,
 * `_ng_rollout_index`), which genrm_compare groups its verifies by; other tasksets unchanged.
 */
export function stampGroupMember(task: Task, m: GroupMember): Task {
  const out = structuredClone(task);
  if (task.task_id.taskset !== 'genrm') return out;
  checkInt('rolloutIndex', m.rolloutIndex, 0);
  out.task_input.task_data = {
    ...out.task_input.task_data,
    _ng_group_id: m.groupId,
    _ng_group_attempt: m.groupAttempt ?? 0,
    _ng_rollout_index: m.rolloutIndex,
  };
  return out;
}

/** The task sibling `k` of a prompt group runs. */
export function siblingTask(group: PromptGroup, k: number, groupAttempt = 0): Task {
  if (!Number.isSafeInteger(k) || k < 0 || k >= group.size) throw new RangeError(`sibling index ${k} outside 0..${group.size - 1}`);
  return stampGroupMember(group.task, { groupId: group.group_id, rolloutIndex: k, groupAttempt });
}
