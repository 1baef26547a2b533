// Target-level resolution (controller.md §5.6, §5.7): one knob, `rollout_recovery.target_level`,
// lowered per environment to what Gym discovery says the environment supports, with coarser-only
// overrides by agent or task source. Pure and deterministic (imported by workflow code).
import type { EnvironmentCapabilities } from '../protocol/controller.js';
import type { RecoveryGranularity, TargetLevel } from './ledger.js';

/** Finest to coarsest. */
export const TARGET_LEVELS: readonly TargetLevel[] = ['turn', 'sibling', 'prompt_group'];

export type { EnvironmentCapabilities, ResourcesCheckpointMode } from '../protocol/controller.js';

export type LevelSource = 'agent_override' | 'task_source_override' | 'target';

export interface EnvironmentLevel {
  environment: string;
  agent: string;
  /** Live-failure unit: `prompt_group` always for group-scored environments. */
  recovery_granularity: RecoveryGranularity;
  restore_level: TargetLevel;
  /** The level the configuration asked for (override or target), before capability lowering. */
  requested_level: TargetLevel;
  decided_by: LevelSource;
  /** The environment's capabilities forced a level coarser than `requested_level`. */
  lowered: boolean;
  warning?: string;
}

export interface ResolveLevelsInput {
  target: TargetLevel;
  environments: readonly EnvironmentCapabilities[];
  /** `rollout_recovery.agent_target_level_overrides`: agent name → coarser level. */
  agentOverrides?: Readonly<Record<string, TargetLevel>>;
  /** `rollout_recovery.task_source_target_level_overrides`: task source → coarser level. */
  taskSourceOverrides?: Readonly<Record<string, TargetLevel>>;
  /** Task source → environment name (`grpo.environments`); needed to apply task-source overrides. */
  taskSourceEnvironments?: Readonly<Record<string, string>>;
  /** `grpo.num_generations_per_prompt`. */
  numGenerationsPerPrompt: number;
  /** `async_rl.rollout_timeout_s` (null = no deadline). */
  rolloutTimeoutS: number | null;
  /** The environment server's `cohort_collection_timeout_s`: one value for all, or per environment. */
  cohortCollectionTimeoutS?: number | null | Readonly<Record<string, number | null>>;
}

export interface ResolvedLevels {
  /** Keyed by environment name. */
  levels: Record<string, EnvironmentLevel>;
  /** One per lowered environment, in discovery order. */
  warnings: string[];
}

export interface TargetLevelProblem {
  /** The config key (or discovery field) at fault. */
  key: string;
  message: string;
}

/** A setup-time rejection (§5.7); lists every problem found, each naming its config key. */
export class TargetLevelError extends Error {
  readonly problems: readonly TargetLevelProblem[];
  constructor(problems: readonly TargetLevelProblem[]) {
    super(`invalid rollout recovery setup:\n${problems.map((p) => `  - ${p.key}: ${p.message}`).join('\n')}`);
    this.name = 'TargetLevelError';
    this.problems = problems;
  }
}

const AGENT_OVERRIDES_KEY = 'rollout_recovery.agent_target_level_overrides';
const TASK_SOURCE_OVERRIDES_KEY = 'rollout_recovery.task_source_target_level_overrides';

export function levelRank(level: TargetLevel): number {
  return TARGET_LEVELS.indexOf(level);
}

/** `a` is strictly finer than `b`. */
export function isFiner(a: TargetLevel, b: TargetLevel): boolean {
  return levelRank(a) < levelRank(b);
}

function isLevel(v: unknown): v is TargetLevel {
  return typeof v === 'string' && (TARGET_LEVELS as readonly string[]).includes(v);
}

/**
 * Why the environment cannot restore at `turn`, or undefined when it can. Restart-only resources
 * are lowered (not kept at `turn`): §5.6 rule 4 discards their saved turns at restore anyway, so
 * claiming `turn` would promise a resume that never happens; `sibling` says what restore really does
 * (for a group-scored environment the whole group reruns, as the GenRM table says until Gym's
 * stateless fix).
 */
function turnBlocker(env: EnvironmentCapabilities): string | undefined {
  const reasons: string[] = [];
  if (!env.supports_continuations) reasons.push(`agent ${env.agent} does not support continuations`);
  if (env.resources_checkpoint_mode === 'restart_only') reasons.push('its resources are restart_only, so saved turns are discarded at restore');
  return reasons.length ? reasons.join('; ') : undefined;
}

/** The configured cohort deadline for the environment, else what its server reported. */
function cohortTimeoutOf(input: ResolveLevelsInput, env: EnvironmentCapabilities): number | null {
  const c = input.cohortCollectionTimeoutS;
  const configured = c === undefined || c === null || typeof c === 'number' ? c : c[env.environment];
  return configured ?? env.cohort_collection_timeout_s ?? null;
}

/**
 * Resolves (`recovery_granularity`, `restore_level`) per environment. Resolution order: agent
 * override, then task-source override, then the target; then capability lowering to the finest level
 * at or below the requested one. Throws TargetLevelError listing every setup-time rejection.
 */
export function resolveLevels(input: ResolveLevelsInput): ResolvedLevels {
  const problems: TargetLevelProblem[] = [];
  const { target } = input;
  const agentOverrides = input.agentOverrides ?? {};
  const taskSourceOverrides = input.taskSourceOverrides ?? {};
  const taskSourceEnvironments = input.taskSourceEnvironments ?? {};

  if (!isLevel(target)) {
    problems.push({ key: 'rollout_recovery.target_level', message: `unknown level ${JSON.stringify(target)} (expected ${TARGET_LEVELS.join(', ')})` });
    throw new TargetLevelError(problems);
  }

  const byName = new Map<string, EnvironmentCapabilities>();
  for (const env of input.environments) {
    if (byName.has(env.environment)) problems.push({ key: `discovery.environments.${env.environment}`, message: 'environment reported twice by discovery' });
    byName.set(env.environment, env);
  }
  const knownAgents = new Set(input.environments.map((e) => e.agent));

  // Overrides: coarser only, and only for things discovery found (an unmatched key must not fall back silently).
  const checkOverride = (key: string, level: unknown): boolean => {
    if (!isLevel(level)) {
      problems.push({ key, message: `unknown level ${JSON.stringify(level)} (expected ${TARGET_LEVELS.join(', ')})` });
      return false;
    }
    if (isFiner(level, target)) {
      problems.push({ key, message: `override ${level} is finer than rollout_recovery.target_level ${target}; overrides may only force a coarser level` });
      return false;
    }
    return true;
  };
  for (const [agent, level] of Object.entries(agentOverrides)) {
    const key = `${AGENT_OVERRIDES_KEY}.${agent}`;
    if (!knownAgents.has(agent))
      problems.push({ key, message: `agent ${agent} was not found by Gym discovery (known: ${[...knownAgents].sort().join(', ') || 'none'})` });
    checkOverride(key, level);
  }
  // Task-source override per environment; two sources of one environment must agree.
  const sourceLevel = new Map<string, { level: TargetLevel; source: string }>();
  for (const [source, level] of Object.entries(taskSourceOverrides)) {
    const key = `${TASK_SOURCE_OVERRIDES_KEY}.${source}`;
    const env = taskSourceEnvironments[source];
    if (env === undefined || !byName.has(env)) {
      problems.push({
        key,
        message:
          env === undefined ? `task source ${source} is not configured` : `task source ${source} maps to environment ${env}, which Gym discovery did not find`,
      });
      checkOverride(key, level);
      continue;
    }
    if (!checkOverride(key, level)) continue;
    const prev = sourceLevel.get(env);
    if (prev && prev.level !== level) {
      problems.push({ key, message: `conflicts with ${TASK_SOURCE_OVERRIDES_KEY}.${prev.source} (${prev.level}) for environment ${env}` });
      continue;
    }
    sourceLevel.set(env, { level, source });
  }

  const levels: Record<string, EnvironmentLevel> = {};
  const warnings: string[] = [];
  for (const env of input.environments) {
    const agentLevel = agentOverrides[env.agent];
    const srcLevel = sourceLevel.get(env.environment)?.level;
    let requested: TargetLevel = target;
    let decidedBy: LevelSource = 'target';
    if (isLevel(agentLevel) && !isFiner(agentLevel, target)) {
      requested = agentLevel;
      decidedBy = 'agent_override';
    } else if (srcLevel !== undefined) {
      requested = srcLevel;
      decidedBy = 'task_source_override';
    }

    const groupScored = env.group_size !== null;
    if (groupScored) {
      // §5.7 combinations that fail, for group-scored environments.
      if (env.group_size !== input.numGenerationsPerPrompt) {
        problems.push({
          key: 'grpo.num_generations_per_prompt',
          message: `is ${input.numGenerationsPerPrompt} but group-scored environment ${env.environment} has num_rollouts_per_prompt ${env.group_size}; a group could never reach its size`,
        });
      }
      if (input.rolloutTimeoutS === null && cohortTimeoutOf(input, env) === null) {
        problems.push({
          key: 'async_rl.rollout_timeout_s',
          message: `group-scored environment ${env.environment} needs async_rl.rollout_timeout_s or the server's cohort_collection_timeout_s, so a group that never assembles is ended`,
        });
      }
      // Judged on the configured level: the prepare barrier is what hangs, not the restore.
      if (requested === 'turn' && !env.verify_replayable) {
        problems.push({
          key: 'rollout_recovery.target_level',
          message: `turn requires checkpoint_replayable_verify: true on group-scored agent ${env.agent} (environment ${env.environment}); otherwise prepare cannot finish while a group sits in /verify (or override ${AGENT_OVERRIDES_KEY}.${env.agent} to a coarser level)`,
        });
      }
    }

    let restore: TargetLevel = requested;
    let warning: string | undefined;
    const blocker = requested === 'turn' ? turnBlocker(env) : undefined;
    if (blocker !== undefined) {
      restore = 'sibling';
      warning = `environment ${env.environment}: recovery level lowered from turn to sibling because ${blocker}`;
      warnings.push(warning);
    }
    const granularity: RecoveryGranularity = groupScored || restore === 'prompt_group' ? 'prompt_group' : 'sibling';
    levels[env.environment] = {
      environment: env.environment,
      agent: env.agent,
      recovery_granularity: granularity,
      restore_level: restore,
      requested_level: requested,
      decided_by: decidedBy,
      lowered: warning !== undefined,
      ...(warning !== undefined ? { warning } : {}),
    };
  }

  if (problems.length) throw new TargetLevelError(problems);
  return { levels, warnings };
}
