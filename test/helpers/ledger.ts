// Ledgers for unit tests, built with the real transitions (workflows/ledger.ts).
import * as L from '../../workflows/ledger.js';

export interface GroupOptions {
  size?: number;
  granularity?: L.RecoveryGranularity;
  level?: L.TargetLevel;
}

/** Reserves a counter_env group `id` of `size` siblings (attempt 0 each). */
export function reserve(l: L.Ledger, id: string, { size = 2, granularity = 'sibling', level = 'turn' }: GroupOptions = {}): L.PromptGroup {
  return L.reserveGroup(l, {
    group_id: id,
    prompt_id: `prompt-${id}`,
    task_source: 'counter',
    environment: 'counter_env',
    recovery_granularity: granularity,
    restore_level: level,
    target_step: 0,
    tasks: Array.from({ length: size }, (_, g) => ({ g })),
  });
}

/** Marks every reserved attempt dispatched to `counter_env`. */
export function dispatchAll(l: L.Ledger): void {
  for (const { group, sibling } of L.reservedAttempts(l)) L.markDispatched(group, sibling, 'counter_env');
}

export const ep = (rollout_id: string, attempt = 0): { rollout_id: string; attempt: number } => ({ rollout_id, attempt });
