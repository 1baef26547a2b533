// The task dataset and dataloader, and the task/run schemas and digest of protocol/tasks.ts.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { COUNTER_TOOLS, WEATHER_TOOLS, generateTasks, promptGroups, siblingTask, stampGroupMember, taskAt } from '../../activities/dataset.js';
import { canonicalJson } from '../../protocol/canonical-json.js';
import { ResponsesFunctionToolSchema } from '../../protocol/openai.js';
import { CITIES, RunReplySchema, RunRequestSchema, TaskSchema, parseTaskLine, renderTaskLine, taskDigest, type Task } from '../../protocol/tasks.js';
import { situationOf } from '../../servers/inference/policy.js';

const userText = (t: Task): string => {
  const input = t.task_input.responses_create_params.input as { role: string; content: string }[];
  return input.find((m) => m.role === 'user')!.content;
};

describe('generateTasks', () => {
  it('is deterministic per seed', () => {
    expect(generateTasks({ seed: 7, count: 30 })).toEqual(generateTasks({ seed: 7, count: 30 }));
    expect(generateTasks({ seed: 8, count: 30 })).not.toEqual(generateTasks({ seed: 7, count: 30 }));
    expect(generateTasks({ seed: 7, count: 30 })[17]).toEqual(taskAt(7, 17));
  });

  it('interleaves the tasksets and honours a subset', () => {
    expect(generateTasks({ seed: 1, count: 6 }).map((t) => t.task_id.taskset)).toEqual(['counter', 'weather', 'genrm', 'counter', 'weather', 'genrm']);
    expect(new Set(generateTasks({ seed: 1, count: 5, tasksets: ['weather'] }).map((t) => t.task_id.taskset))).toEqual(new Set(['weather']));
    expect(() => generateTasks({ seed: 1, count: 1, tasksets: [] })).toThrow(RangeError);
    expect(() => generateTasks({ seed: -1, count: 1 })).toThrow(RangeError);
  });

  it('produces valid tasks whose [task …] line matches task_data and tools', () => {
    const tasks = generateTasks({ seed: 3, count: 300 });
    const ids = new Set<string>();
    for (const t of tasks) {
      expect(TaskSchema.parse(t)).toEqual(t);
      expect(RunRequestSchema.parse({ episode_id: { rollout_id: 'r1', attempt: 0 }, task: t }).task).toEqual(t);
      ids.add(t.task_id.task_id);
      const input = t.task_input.responses_create_params.input as { role: string }[];
      expect(input.map((m) => m.role)).toEqual(['developer', 'user']);
      const text = userText(t);
      const line = parseTaskLine(text)!;
      expect(text.endsWith(renderTaskLine(line))).toBe(true);
      expect(line.taskset).toBe(t.task_id.taskset);
      const tools = t.task_input.responses_create_params.tools!;
      for (const tool of tools) ResponsesFunctionToolSchema.parse(tool);
      const data = t.task_input.task_data;
      if (line.taskset === 'counter') {
        expect(data).toEqual({ initial_count: line.start, expected_count: line.target });
        expect(line.start).toBeGreaterThanOrEqual(0);
        expect(line.start).toBeLessThanOrEqual(5);
        expect(line.target - line.start).toBeGreaterThanOrEqual(2);
        expect(line.target - line.start).toBeLessThanOrEqual(6);
        expect(tools).toEqual(COUNTER_TOOLS);
        expect(situationOf(input as never)).toBe(`counter:remaining=${line.target - line.start}`);
      } else if (line.taskset === 'weather') {
        expect(data).toEqual({ city: line.city });
        expect(CITIES).toContain(line.city);
        expect(tools).toEqual(WEATHER_TOOLS);
      } else {
        expect(data).toEqual({ prompt_id: line.prompt });
        expect(line.prompt).toMatch(/^p\d+$/);
        expect(tools).toEqual([]);
      }
    }
    expect(ids.size).toBe(tasks.length);
    // Every counter start and gap occurs.
    const gaps = new Set(tasks.filter((t) => t.task_id.taskset === 'counter').map((t) => `${t.task_input.task_data.initial_count}`));
    expect(gaps.size).toBe(6);
  });
});

describe('promptGroups', () => {
  it('is resumable from its cursor', () => {
    const all = promptGroups({ seed: 5, cursor: 0, groups: 8, groupSize: 4 });
    const a = promptGroups({ seed: 5, cursor: 0, groups: 3, groupSize: 4 });
    const b = promptGroups({ seed: 5, cursor: a.cursor, groups: 5, groupSize: 4 });
    expect(a.cursor).toBe(3);
    expect(b.cursor).toBe(8);
    expect([...a.groups, ...b.groups]).toEqual(all.groups);
    expect(new Set(all.groups.map((g) => g.group_id)).size).toBe(8);
    expect(all.groups[2]).toMatchObject({ prompt_index: 2, size: 4, task: taskAt(5, 2) });
  });

  it('stamps genrm siblings with the group coordinates, leaves others alone', () => {
    const { groups } = promptGroups({ seed: 2, cursor: 0, groups: 3, groupSize: 4 });
    const genrm = groups.find((g) => g.task.task_id.taskset === 'genrm')!;
    const members = [0, 1, 2, 3].map((k) => siblingTask(genrm, k));
    members.forEach((m, k) => {
      expect(m.task_input.task_data).toEqual({
        prompt_id: genrm.task.task_input.task_data.prompt_id,
        _ng_group_id: genrm.group_id,
        _ng_group_attempt: 0,
        _ng_rollout_index: k,
      });
      expect(TaskSchema.parse(m)).toEqual(m);
    });
    // The group's own task is not mutated; a relaunched cohort carries its attempt.
    expect(genrm.task.task_input.task_data).toEqual({ prompt_id: genrm.task.task_input.task_data.prompt_id });
    expect(siblingTask(genrm, 1, 2).task_input.task_data._ng_group_attempt).toBe(2);
    expect(() => siblingTask(genrm, 4)).toThrow(RangeError);
    const counter = groups.find((g) => g.task.task_id.taskset === 'counter')!;
    expect(siblingTask(counter, 3)).toEqual(counter.task);
    expect(stampGroupMember(counter.task, { groupId: 'x', rolloutIndex: 0 })).toEqual(counter.task);
  });
});

describe('task schemas', () => {
  const task = taskAt(1, 1);

  it('closes every level except responses_create_params and task_data', () => {
    const req = { episode_id: { rollout_id: 'wx-17' }, task };
    expect(RunRequestSchema.parse(req).episode_id).toEqual({ rollout_id: 'wx-17', attempt: 0 });
    const bad = (mut: (t: any) => void): boolean => {
      const r = structuredClone(req) as any;
      mut(r);
      return RunRequestSchema.safeParse(r).success;
    };
    expect(bad((r) => (r.extra = 1))).toBe(false);
    expect(bad((r) => (r.task.extra = 1))).toBe(false);
    expect(bad((r) => (r.task.task_id.extra = 1))).toBe(false);
    expect(bad((r) => (r.task.task_input.extra = 1))).toBe(false);
    expect(bad((r) => (r.task.task_id.taskset = ''))).toBe(false);
    expect(bad((r) => (r.episode_id.rollout_id = 'wx-17-a1'))).toBe(false);
    expect(bad((r) => (r.task.task_input.responses_create_params.temperature = 0.5))).toBe(true);
    expect(bad((r) => (r.task.task_input.task_data.anything = { deep: [1] }))).toBe(true);
    // Defaults are filled in (so the digest covers the same fields as the parsed model's).
    const minimal = { task_id: task.task_id, task_input: { responses_create_params: { input: 'hi' } } };
    expect(TaskSchema.parse(minimal).task_input).toEqual({ responses_create_params: { input: 'hi' }, task_data: {}, agent_timeout_seconds: null });
  });

  it('run replies carry exactly one of result and failure', () => {
    const head = { episode_id: { rollout_id: 'wx-17', attempt: 0 }, task_id: task.task_id };
    const result = { responses_create_params: { input: [] }, response: { id: 'r', output: [] }, reward: 1, mask_sample: false, extra: 'kept' };
    const failure = { failure_reason: 'boom', terminal: false, stage: 'agent' };
    expect(RunReplySchema.parse({ ...head, result, failure: null }).result).toMatchObject({ reward: 1, extra: 'kept' });
    expect(RunReplySchema.parse({ ...head, result: null, failure }).failure).toMatchObject({ stage: 'agent' });
    expect(RunReplySchema.safeParse({ ...head, result, failure }).success).toBe(false);
    expect(RunReplySchema.safeParse({ ...head, result: null, failure: null }).success).toBe(false);
    expect(RunReplySchema.safeParse({ ...head, result: null, failure: { ...failure, stage: 'bogus' } }).success).toBe(false);
  });
});

describe('taskDigest', () => {
  it('is SHA-256 of Python-style canonical JSON', () => {
    // Reference from python3: json.dumps(v, sort_keys=True, separators=(",", ":")).
    const v = { b: [1, 2.5, null, true], a: { z: 'é€😀\u007f\n\t"\\', y: -3, Ä: 1, a: 'x/y' }, '\ue000': 1, '😀': 2 };
    const expected =
      '{"a":{"a":"x/y","y":-3,"z":"\\u00e9\\u20ac\\ud83d\\ude00\\u007f\\n\\t\\"\\\\","\\u00c4":1},"b":[1,2.5,null,true],"\\ue000":1,"\\ud83d\\ude00":2}';
    expect(canonicalJson(v)).toBe(expected);
    expect(createHash('sha256').update(expected).digest('hex')).toBe('d5849b9ddd1ab35feddc1181e9591933b2b8de30544ffdfcdb593e217975211c');
  });

  it('ignores key order, sees every value', () => {
    const t = taskAt(4, 2);
    const reordered = { task_input: { ...t.task_input }, task_id: { task_id: t.task_id.task_id, taskset: t.task_id.taskset } };
    expect(taskDigest(reordered as Task)).toBe(taskDigest(t));
    expect(taskDigest(t)).toMatch(/^[0-9a-f]{64}$/);
    const other = structuredClone(t);
    other.task_input.agent_timeout_seconds = 30;
    expect(taskDigest(other)).not.toBe(taskDigest(t));
    expect(() => canonicalJson({ x: NaN })).toThrow(TypeError);
  });
});
