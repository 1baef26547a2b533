// The recovery ledger's transitions (controller.md §5; its shape in ledger-shape.ts): prompt
// groups reserved, attempts dispatched, sealed, failed, continued or restarted. Pure functions on
// plain data: each rollout shard holds its slice in its state and carries it across
// continue-as-new; snapshots persist the slices as ledger parts.
import { captureKey, type CaptureKey, type EpisodeId } from '../protocol/episode-id.js';
import { LEDGER_SCHEMA_VERSION, LedgerError, type Attempt, type Ledger, type PromptGroup, type Sibling } from './ledger-shape.js';

export * from './ledger-shape.js';

export function emptyLedger(run: string): Ledger {
  return { schema_version: LEDGER_SCHEMA_VERSION, run, cursor: 0, groups: {}, order: [] };
}

export function currentAttempt(s: Sibling): Attempt {
  const a = s.attempts[s.attempts.length - 1];
  if (!a) throw new LedgerError(`sibling ${s.rollout_id} has no attempt`);
  return a;
}

export function episodeOfAttempt(s: Sibling, a: Attempt): EpisodeId {
  return { rollout_id: s.rollout_id, attempt: a.gym_attempt };
}

export function siblingKey(s: Sibling): CaptureKey {
  return captureKey(episodeOfAttempt(s, currentAttempt(s)));
}

/** Stable rollout ID of one sibling; never ends with a reserved `-a<N>` suffix. */
export function rolloutIdOf(groupId: string, generationIndex: number): string {
  return `${groupId}.g${generationIndex}`;
}

/** The group a rollout ID belongs to (the inverse of `rolloutIdOf`). */
export function groupIdOfRollout(rolloutId: string): string {
  return rolloutId.slice(0, rolloutId.lastIndexOf('.g'));
}

/** What reserving a group takes: its identity and tasks, as the group keeps them. */
export type ReserveInput = Pick<
  PromptGroup,
  'group_id' | 'prompt_id' | 'task_source' | 'environment' | 'recovery_granularity' | 'restore_level' | 'target_step' | 'tasks' | 'task_ref'
> & {
  /** Group size when the tasks are referenced rather than listed. */
  size?: number;
};

/** Reserve: a new group with every sibling at a `reserved` first attempt. */
export function reserveGroup(l: Ledger, g: ReserveInput): PromptGroup {
  if (l.groups[g.group_id]) throw new LedgerError(`group ${g.group_id} is already in the ledger`);
  const group: PromptGroup = {
    ...g,
    expected_generations: g.size ?? g.tasks.length,
    status: 'generating',
    siblings: Array.from({ length: g.size ?? g.tasks.length }, (_, i) => ({
      generation_index: i,
      rollout_id: rolloutIdOf(g.group_id, i),
      attempts: [{ gym_attempt: 0, status: 'reserved', gym_instance_id: null, reward: null, mask_sample: null, continued: false }],
    })),
  };
  l.groups[g.group_id] = group;
  l.order.push(g.group_id);
  return group;
}

/** Every sibling whose current attempt waits to be dispatched, in reservation order. */
export function reservedAttempts(l: Ledger): Array<{ group: PromptGroup; sibling: Sibling; attempt: Attempt }> {
  const out: Array<{ group: PromptGroup; sibling: Sibling; attempt: Attempt }> = [];
  for (const id of l.order) {
    const group = l.groups[id]!;
    if (group.status !== 'generating') continue;
    for (const sibling of group.siblings) {
      const attempt = currentAttempt(sibling);
      if (attempt.status === 'reserved') out.push({ group, sibling, attempt });
    }
  }
  return out;
}

export function dispatchedAttempts(l: Ledger): EpisodeId[] {
  const out: EpisodeId[] = [];
  for (const id of l.order) {
    for (const s of l.groups[id]!.siblings) {
      const a = currentAttempt(s);
      if (a.status === 'dispatched') out.push(episodeOfAttempt(s, a));
    }
  }
  return out;
}

export function markDispatched(group: PromptGroup, sibling: Sibling, instance: string): void {
  const a = currentAttempt(sibling);
  if (a.status !== 'reserved') throw new LedgerError(`attempt ${siblingKey(sibling)} is ${a.status}, not reserved`);
  if (a.continued && a.gym_instance_id !== null && a.gym_instance_id !== instance) {
    throw new LedgerError(`continued attempt ${siblingKey(sibling)} must go back to ${a.gym_instance_id}, not ${instance}`);
  }
  a.status = 'dispatched';
  a.gym_instance_id = instance;
  void group;
}

export function findSibling(l: Ledger, rolloutId: string): { group: PromptGroup; sibling: Sibling } | undefined {
  const dot = rolloutId.lastIndexOf('.g');
  const group = l.groups[rolloutId.slice(0, dot)];
  const sibling = group?.siblings.find((s) => s.rollout_id === rolloutId);
  return group && sibling ? { group, sibling } : undefined;
}

/** What a sealed attempt's report said, as the ledger keeps it. */
export interface SealedOutcome {
  reward: number;
  mask_sample: boolean;
}

/** The outcome of `episode`'s attempt if this ledger sealed it (undefined: not sealed, or its group has left the ledger). */
export function sealedOutcome(l: Ledger, episode: EpisodeId): SealedOutcome | undefined {
  const a = findSibling(l, episode.rollout_id)?.sibling.attempts.find((x) => x.gym_attempt === episode.attempt);
  return a?.status === 'sealed' && a.reward !== null ? { reward: a.reward, mask_sample: a.mask_sample ?? false } : undefined;
}

export type SealResult = 'sealed' | 'duplicate' | 'superseded' | 'unknown';

/**
 * Seals the attempt a result belongs to. A duplicate identical seal is a no-op; a late result of a
 * superseded attempt is rejected; a conflicting second seal is an error.
 */
export function sealAttempt(l: Ledger, episode: EpisodeId, reward: number, maskSample: boolean): SealResult {
  const found = findSibling(l, episode.rollout_id);
  if (!found) return 'unknown';
  const { group, sibling } = found;
  const a = currentAttempt(sibling);
  if (a.gym_attempt !== episode.attempt) {
    const old = sibling.attempts.find((x) => x.gym_attempt === episode.attempt);
    if (old?.status === 'sealed' && old.reward === reward) return 'duplicate';
    return 'superseded';
  }
  if (a.status === 'sealed') {
    if (a.reward === reward && a.mask_sample === maskSample) return 'duplicate';
    throw new LedgerError(`conflicting second seal of ${captureKey(episode)}: ${a.reward} vs ${reward}`);
  }
  if (a.status !== 'dispatched') return 'superseded';
  a.status = 'sealed';
  a.reward = reward;
  a.mask_sample = maskSample;
  if (group.siblings.every((s) => currentAttempt(s).status === 'sealed')) group.status = 'ready_to_finalize';
  return 'sealed';
}

/**
 * A live failure of one attempt: the sibling (or, for prompt-group granularity, every unsealed
 * sibling of the group) gets a fresh attempt N+1 that starts from its input.
 */
export function failAttempt(l: Ledger, episode: EpisodeId, reason: string): Sibling[] {
  const found = findSibling(l, episode.rollout_id);
  if (!found) return [];
  const { group, sibling } = found;
  const a = currentAttempt(sibling);
  if (a.gym_attempt !== episode.attempt || (a.status !== 'dispatched' && a.status !== 'reserved')) return [];
  a.status = 'failed';
  a.reason = reason;
  // Group-scored or prompt-group recovery: the whole cohort starts over together, as a new cohort.
  const affected = group.recovery_granularity === 'prompt_group' ? group.siblings : [sibling];
  if (group.recovery_granularity === 'prompt_group') group.cohort_attempt = (group.cohort_attempt ?? 0) + 1;
  for (const s of affected) {
    const cur = currentAttempt(s);
    if (s !== sibling) {
      cur.status = 'abandoned';
      cur.reward = null;
      cur.mask_sample = null;
    }
    s.attempts.push(nextFreshAttempt(s));
  }
  group.status = 'generating';
  return affected;
}

function nextFreshAttempt(s: Sibling): Attempt {
  const max = Math.max(...s.attempts.map((a) => a.gym_attempt));
  return { gym_attempt: max + 1, status: 'reserved', gym_instance_id: null, reward: null, mask_sample: null, continued: false };
}

/** Attempts (by sibling) whose Gym attempt the controller has given up on (need retire before redispatch). */
export function attemptsToRetire(affected: readonly Sibling[]): EpisodeId[] {
  const out: EpisodeId[] = [];
  for (const s of affected) {
    const prev = s.attempts[s.attempts.length - 2];
    // Only attempts that reached Gym (dispatched at some point) can have live state to stop.
    if (prev && prev.gym_instance_id !== null) out.push(episodeOfAttempt(s, prev));
  }
  return out;
}

export function readyGroups(l: Ledger): PromptGroup[] {
  return l.order.map((id) => l.groups[id]!).filter((g) => g.status === 'ready_to_finalize');
}

/** A consumed group leaves the ledger (its results are owned by the trainer step now). */
export function consumeGroup(l: Ledger, groupId: string): PromptGroup {
  const g = l.groups[groupId];
  if (g?.status !== 'ready_to_finalize') throw new LedgerError(`group ${groupId} is not ready to finalize`);
  delete l.groups[groupId];
  l.order = l.order.filter((id) => id !== groupId);
  return g;
}

export function unfinishedGroupCount(l: Ledger): number {
  return l.order.filter((id) => l.groups[id]!.status === 'generating').length;
}

/** Rollout IDs of every sibling in the ledger (for forget bookkeeping). */
export function rolloutIds(g: PromptGroup): string[] {
  return g.siblings.map((s) => s.rollout_id);
}

// --- recovery (controller.md §4, §5.5) ------------------------------------------------------

/** Capture keys whose model calls form the current attempt's trajectory (a continued chain). */
export function lineageKeys(s: Sibling): CaptureKey[] {
  const keys: CaptureKey[] = [];
  for (let i = s.attempts.length - 1; i >= 0; i--) {
    const a = s.attempts[i]!;
    keys.unshift(captureKey(episodeOfAttempt(s, a)));
    if (!a.continued) break;
  }
  return keys;
}

/** Siblings of generating groups whose current attempt is not sealed. */
export function unsealedSiblings(l: Ledger): Array<{ group: PromptGroup; sibling: Sibling }> {
  const out: Array<{ group: PromptGroup; sibling: Sibling }> = [];
  for (const id of l.order) {
    const group = l.groups[id]!;
    for (const sibling of group.siblings) if (currentAttempt(sibling).status !== 'sealed') out.push({ group, sibling });
  }
  return out;
}

/**
 * Gym restored the current attempt N of this sibling as N+1: it continues from its saved turn
 * on the same environment server.
 */
export function continueFromRestore(s: Sibling, instance: string): Attempt {
  const cur = currentAttempt(s);
  cur.status = 'abandoned';
  cur.reason = 'gym_restored';
  const next: Attempt = { gym_attempt: cur.gym_attempt + 1, status: 'reserved', gym_instance_id: instance, reward: null, mask_sample: null, continued: true };
  s.attempts.push(next);
  return next;
}

/**
 * Start the sibling over from its input as a fresh attempt, above every attempt number Gym may
 * have seen (`skip` reserves numbers a failed restore already retired).
 */
export function restartFromInput(s: Sibling, reason: string, skip = 0): Attempt {
  const cur = currentAttempt(s);
  if (cur.status !== 'sealed') {
    cur.status = 'abandoned';
    cur.reason = reason;
    cur.reward = null;
    cur.mask_sample = null;
  }
  const max = Math.max(...s.attempts.map((a) => a.gym_attempt)) + skip;
  const next: Attempt = { gym_attempt: max + 1, status: 'reserved', gym_instance_id: null, reward: null, mask_sample: null, continued: false };
  s.attempts.push(next);
  return next;
}
