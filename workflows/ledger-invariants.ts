// Load-time invariants of the recovery ledger (controller.md §5.2), for our ledger shape
// (workflows/ledger.ts): a snapshot's ledger that violates any of them is rejected rather than
// restored. Pure and deterministic (imported by workflow code).
import { LEDGER_SCHEMA_VERSION, rolloutIdOf, type Ledger, type PromptGroup, type Sibling } from './ledger.js';

export const SUPPORTED_LEDGER_SCHEMA_VERSIONS: readonly number[] = [LEDGER_SCHEMA_VERSION];

const ATTEMPT_STATUSES = new Set(['reserved', 'dispatched', 'sealed', 'failed', 'abandoned']);
const GROUP_STATUSES = new Set(['generating', 'ready_to_finalize', 'consumed']);
const GRANULARITIES = new Set(['sibling', 'prompt_group']);
const LEVELS = new Set(['turn', 'sibling', 'prompt_group']);

export interface LedgerViolation {
  /** Where: `ledger`, `group <id>`, `sibling <rollout id>` or `attempt <rollout id>#<index>`. */
  at: string;
  message: string;
}

export class LedgerInvariantError extends Error {
  readonly violations: readonly LedgerViolation[];
  constructor(violations: readonly LedgerViolation[]) {
    super(`recovery ledger violates ${violations.length} load-time invariant(s):\n${violations.map((v) => `  - ${v.at}: ${v.message}`).join('\n')}`);
    this.name = 'LedgerInvariantError';
    this.violations = violations;
  }
}

/** Every violated invariant (empty when the ledger is loadable). */
export function ledgerViolations(l: Ledger): LedgerViolation[] {
  const out: LedgerViolation[] = [];
  const bad = (at: string, message: string) => out.push({ at, message });

  if (!SUPPORTED_LEDGER_SCHEMA_VERSIONS.includes(l.schema_version)) {
    bad('ledger', `schema_version ${l.schema_version} is not supported (supported: ${SUPPORTED_LEDGER_SCHEMA_VERSIONS.join(', ')})`);
  }
  if (!Number.isSafeInteger(l.cursor) || l.cursor < 0) bad('ledger', `cursor ${l.cursor} is not a non-negative integer`);

  // `order` lists exactly the group IDs, once each.
  const seen = new Set<string>();
  for (const id of l.order) {
    if (seen.has(id)) bad('ledger', `order lists group ${id} more than once`);
    seen.add(id);
    if (!Object.hasOwn(l.groups, id)) bad('ledger', `order lists group ${id}, which is not in groups`);
  }
  for (const id of Object.keys(l.groups)) if (!seen.has(id)) bad('ledger', `group ${id} is missing from order`);

  for (const [key, g] of Object.entries(l.groups)) checkGroup(key, g, bad);
  return out;
}

/** Throws LedgerInvariantError listing every violated invariant. */
export function checkLedger(l: Ledger): void {
  const violations = ledgerViolations(l);
  if (violations.length) throw new LedgerInvariantError(violations);
}

function checkGroup(key: string, g: PromptGroup, bad: (at: string, message: string) => void): void {
  const at = `group ${key}`;
  if (g.group_id !== key) bad(at, `group_id ${g.group_id} differs from its key`);
  if (!GROUP_STATUSES.has(g.status)) bad(at, `unknown status ${String(g.status)}`);
  if (!GRANULARITIES.has(g.recovery_granularity)) bad(at, `unknown recovery_granularity ${String(g.recovery_granularity)}`);
  if (!LEVELS.has(g.restore_level)) bad(at, `unknown restore_level ${String(g.restore_level)}`);
  if (!Number.isSafeInteger(g.expected_generations) || g.expected_generations < 1)
    bad(at, `expected_generations ${g.expected_generations} is not a positive integer`);
  if (g.siblings.length !== g.expected_generations) bad(at, `has ${g.siblings.length} siblings but expected_generations is ${g.expected_generations}`);
  g.siblings.forEach((s, i) => {
    if (s.generation_index !== i) bad(at, `generation indices are not contiguous from 0: position ${i} holds ${s.generation_index}`);
    checkSibling(g, s, bad);
  });

  const sealed = g.siblings.filter((s) => s.attempts.at(-1)?.status === 'sealed').length;
  if (g.status === 'generating' && g.siblings.length > 0 && sealed === g.siblings.length) {
    bad(at, 'is generating but every sibling is sealed (it should be ready_to_finalize)');
  }
  if (g.status !== 'generating' && sealed !== g.siblings.length) {
    bad(at, `is ${g.status} but ${g.siblings.length - sealed} sibling(s) are not sealed`);
  }
}

function checkSibling(g: PromptGroup, s: Sibling, bad: (at: string, message: string) => void): void {
  const at = `sibling ${s.rollout_id}`;
  const expected = rolloutIdOf(g.group_id, s.generation_index);
  if (s.rollout_id !== expected) bad(at, `rollout_id should be ${expected}`);
  if (s.attempts.length === 0) {
    bad(at, 'has no attempt');
    return;
  }
  s.attempts.forEach((a, i) => {
    const aat = `attempt ${s.rollout_id}#${i}`;
    const prev = s.attempts[i - 1];
    if (!Number.isSafeInteger(a.gym_attempt) || a.gym_attempt < 0) bad(aat, `gym_attempt ${a.gym_attempt} is not a non-negative integer`);
    // Unique and increasing: each attempt number is above every earlier one of the sibling.
    if (prev && !(a.gym_attempt > prev.gym_attempt)) bad(aat, `gym_attempt ${a.gym_attempt} does not increase over the previous attempt's ${prev.gym_attempt}`);
    if (!ATTEMPT_STATUSES.has(a.status)) bad(aat, `unknown status ${String(a.status)}`);
    // Only the current attempt may still be waiting or running; superseded ones are terminal.
    if (i < s.attempts.length - 1 && (a.status === 'reserved' || a.status === 'dispatched')) bad(aat, `is ${a.status} but superseded by a later attempt`);
    if (a.status === 'sealed') {
      if (typeof a.reward !== 'number' || !Number.isFinite(a.reward)) bad(aat, 'is sealed without a finite reward');
      if (typeof a.mask_sample !== 'boolean') bad(aat, 'is sealed without a boolean mask_sample');
    } else {
      if (a.reward !== null) bad(aat, `is ${a.status} but carries a reward (only sealed attempts do)`);
      if (a.mask_sample !== null) bad(aat, `is ${a.status} but carries mask_sample (only sealed attempts do)`);
    }
    if (a.continued) {
      if (!prev) bad(aat, 'is continued but has no previous attempt to continue');
      if (a.gym_instance_id === null) bad(aat, 'is continued but names no gym_instance_id to return to');
    }
  });
}
