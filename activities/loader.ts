// The dataloader as an activity: the next prompt groups from the deterministic dataset
// (activities/dataset.ts), each with the tasks its siblings run, ready to send as `/run` tasks.
import type { Task, Taskset } from '../protocol/tasks.js';
import { invariantFailure, errorMessage } from './activity-context.js';
import { promptGroups, siblingTask } from './dataset.js';

export interface LoadPromptGroupsInput {
  seed: number;
  /** The next prompt index to pull (the run's dataloader cursor). */
  cursor: number;
  groups: number;
  groupSize: number;
  tasksets?: Taskset[];
  /** Cohort relaunch counter stamped into genrm tasks (prompt-group recovery); default 0. */
  groupAttempt?: number;
  /**
   * Leave the tasks out (`tasks: []`): the run only needs where each group is in the dataset, and
   * each attempt builds its task from that (`taskRef`); 64 groups' tasks were ~145 KB a read.
   */
  withoutTasks?: boolean;
}

export interface LoadedPromptGroup {
  group_id: string;
  /** The dataset's ID of the prompt (`task.task_id.task_id`, e.g. `counter-7-12`). */
  prompt_id: string;
  taskset: string;
  prompt_index: number;
  size: number;
  /** `tasks[k]` is sibling k's task (genrm tasks stamped with the group coordinates). */
  tasks: Task[];
}

export interface LoadedPromptGroups {
  groups: LoadedPromptGroup[];
  /** The cursor after this batch. */
  cursor: number;
}

export async function loadPromptGroups(input: LoadPromptGroupsInput): Promise<LoadedPromptGroups> {
  try {
    const batch = promptGroups({
      seed: input.seed,
      cursor: input.cursor,
      groups: input.groups,
      groupSize: input.groupSize,
      ...(input.tasksets !== undefined ? { tasksets: input.tasksets } : {}),
    });
    return {
      cursor: batch.cursor,
      groups: batch.groups.map((g) => ({
        group_id: g.group_id,
        prompt_id: g.task.task_id.task_id,
        taskset: g.task.task_id.taskset,
        prompt_index: g.prompt_index,
        size: g.size,
        tasks: input.withoutTasks ? [] : Array.from({ length: g.size }, (_, k) => siblingTask(g, k, input.groupAttempt ?? 0)),
      })),
    };
  } catch (err) {
    // Bad arguments (RangeError): the workflow asked for something impossible; retrying cannot help.
    throw invariantFailure(`loadPromptGroups: ${errorMessage(err)}`);
  }
}

export function createLoaderActivities() {
  return { loadPromptGroups };
}
