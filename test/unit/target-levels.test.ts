// Target-level resolution (workflows/target-levels.ts, controller.md §5.6 and §5.7): per-environment
// lowering, group-scored (GenRM) environments, coarser-only overrides, setup-time rejections.
import { describe, expect, it } from 'vitest';
import type { TargetLevel } from '../../workflows/ledger.js';
import { resolveLevels, TargetLevelError, type EnvironmentCapabilities, type ResolveLevelsInput } from '../../workflows/target-levels.js';

/** An ordinary environment that supports everything (simple_agent, stateless resources). */
function env(name: string, over: Partial<EnvironmentCapabilities> = {}): EnvironmentCapabilities {
  return {
    environment: name,
    agent: `${name}_agent`,
    supports_continuations: true,
    resources_checkpoint_mode: 'stateless',
    verify_replayable: true,
    group_size: null,
    ...over,
  };
}

/** A GenRM-compare-like group-scored environment of group size 4, stateless after Gym's fix. */
function genrm(over: Partial<EnvironmentCapabilities> = {}): EnvironmentCapabilities {
  return env('genrm_env', { agent: 'genrm_agent', group_size: 4, ...over });
}

function input(target: TargetLevel, environments: EnvironmentCapabilities[], over: Partial<ResolveLevelsInput> = {}): ResolveLevelsInput {
  return { target, environments, numGenerationsPerPrompt: 4, rolloutTimeoutS: 600, ...over };
}

function one(target: TargetLevel, e: EnvironmentCapabilities, over: Partial<ResolveLevelsInput> = {}) {
  const r = resolveLevels(input(target, [e], over));
  return { level: r.levels[e.environment]!, warnings: r.warnings };
}

/** The TargetLevelError thrown, or a failure. */
function rejection(i: ResolveLevelsInput): TargetLevelError {
  try {
    resolveLevels(i);
  } catch (e) {
    expect(e).toBeInstanceOf(TargetLevelError);
    return e as TargetLevelError;
  }
  throw new Error('expected a TargetLevelError');
}

describe('target levels: rule 7 resolution output (ordinary environment, no override)', () => {
  it.each([
    ['turn', 'sibling', 'turn'],
    ['sibling', 'sibling', 'sibling'],
    ['prompt_group', 'prompt_group', 'prompt_group'],
  ] as const)('target %s → (%s, %s)', (target, granularity, restore) => {
    const { level, warnings } = one(target, env('counter_env'));
    expect(level).toMatchObject({ recovery_granularity: granularity, restore_level: restore, lowered: false, decided_by: 'target', requested_level: target });
    expect(level.warning).toBeUndefined();
    expect(warnings).toEqual([]);
  });

  it('group-scored at turn → (prompt_group, turn)', () => {
    const { level, warnings } = one('turn', genrm());
    expect(level).toMatchObject({ recovery_granularity: 'prompt_group', restore_level: 'turn', lowered: false });
    expect(warnings).toEqual([]);
  });
});

describe('target levels: per-environment lowering (rule 2) and the turn requirements', () => {
  it('an agent without continuation support is lowered to sibling with one warning', () => {
    const { level, warnings } = one('turn', env('weather_env', { supports_continuations: false }));
    expect(level).toMatchObject({ recovery_granularity: 'sibling', restore_level: 'sibling', requested_level: 'turn', lowered: true });
    expect(level.warning).toMatch(/weather_env.*turn to sibling.*weather_env_agent does not support continuations/);
    expect(warnings).toEqual([level.warning]);
  });

  it('restart_only resources are lowered to sibling (rule 4: their saved turns are discarded anyway)', () => {
    const { level, warnings } = one('turn', env('sandbox_env', { resources_checkpoint_mode: 'restart_only' }));
    expect(level).toMatchObject({ recovery_granularity: 'sibling', restore_level: 'sibling', lowered: true });
    expect(level.warning).toMatch(/restart_only/);
    expect(warnings).toHaveLength(1);
  });

  it('exported (export/restore) resources support turn', () => {
    expect(one('turn', env('db_env', { resources_checkpoint_mode: 'exported' })).level).toMatchObject({ restore_level: 'turn', lowered: false });
  });

  it('both blockers give one warning naming both reasons', () => {
    const { level, warnings } = one('turn', env('x_env', { supports_continuations: false, resources_checkpoint_mode: 'restart_only' }));
    expect(warnings).toHaveLength(1);
    expect(level.warning).toMatch(/continuations.*restart_only/);
  });

  it('capabilities matter only at turn: sibling and prompt_group never lower', () => {
    const weak = env('weak_env', { supports_continuations: false, resources_checkpoint_mode: 'restart_only', verify_replayable: false });
    expect(one('sibling', weak)).toMatchObject({ level: { restore_level: 'sibling', lowered: false }, warnings: [] });
    expect(one('prompt_group', weak)).toMatchObject({ level: { restore_level: 'prompt_group', lowered: false }, warnings: [] });
  });

  it('one warning per lowered environment, in discovery order; others keep the target', () => {
    const r = resolveLevels(
      input('turn', [env('a_env', { supports_continuations: false }), env('b_env'), env('c_env', { resources_checkpoint_mode: 'restart_only' })]),
    );
    expect(r.warnings).toHaveLength(2);
    expect(r.warnings[0]).toMatch(/^environment a_env/);
    expect(r.warnings[1]).toMatch(/^environment c_env/);
    expect(r.levels.b_env).toMatchObject({ restore_level: 'turn', lowered: false });
  });
});

describe('target levels: GenRM compare (group-scored) table', () => {
  it('turn (stateless, replayable verify): whole group retried live, all siblings resume from saved turns', () => {
    expect(one('turn', genrm()).level).toMatchObject({ recovery_granularity: 'prompt_group', restore_level: 'turn' });
  });

  it("turn before Gym's stateless fix (restart_only): whole group retried, the group restarts (lowered, warned)", () => {
    const { level, warnings } = one('turn', genrm({ resources_checkpoint_mode: 'restart_only' }));
    expect(level).toMatchObject({ recovery_granularity: 'prompt_group', restore_level: 'sibling', lowered: true });
    expect(warnings).toHaveLength(1);
  });

  it('sibling: whole group retried, whole group rerun from scratch', () => {
    expect(one('sibling', genrm())).toMatchObject({ level: { recovery_granularity: 'prompt_group', restore_level: 'sibling', lowered: false }, warnings: [] });
  });

  it('prompt_group: whole group retried, rerun with saved turns discarded', () => {
    expect(one('prompt_group', genrm()).level).toMatchObject({ recovery_granularity: 'prompt_group', restore_level: 'prompt_group', lowered: false });
  });

  it('a group-scored environment at sibling or prompt_group does not need a replayable verify', () => {
    expect(one('sibling', genrm({ verify_replayable: false })).level.restore_level).toBe('sibling');
    expect(one('prompt_group', genrm({ verify_replayable: false })).level.restore_level).toBe('prompt_group');
  });
});

describe('target levels: §5.7 combinations that fail', () => {
  it('num_rollouts_per_prompt ≠ num_generations_per_prompt for a group-scored environment', () => {
    for (const target of ['turn', 'sibling', 'prompt_group'] as const) {
      const e = rejection(input(target, [genrm({ group_size: 3 })]));
      expect(e.problems).toEqual([expect.objectContaining({ key: 'grpo.num_generations_per_prompt' })]);
      expect(e.message).toMatch(/grpo\.num_generations_per_prompt.*genrm_env.*num_rollouts_per_prompt 3/);
    }
    // Ordinary environments have no group size to match.
    expect(() => resolveLevels(input('turn', [env('counter_env')], { numGenerationsPerPrompt: 7 }))).not.toThrow();
  });

  it('checkpoint_replayable_verify: false on a GenRM agent at target turn', () => {
    const e = rejection(input('turn', [genrm({ verify_replayable: false })]));
    expect(e.problems).toHaveLength(1);
    expect(e.message).toMatch(/rollout_recovery\.target_level.*checkpoint_replayable_verify.*genrm_agent/);
    // An ordinary environment's verify replayability is not part of this rejection.
    expect(() => resolveLevels(input('turn', [env('counter_env', { verify_replayable: false })]))).not.toThrow();
    // Forcing the GenRM agent coarser is the documented way out.
    expect(one('turn', genrm({ verify_replayable: false }), { agentOverrides: { genrm_agent: 'sibling' } }).level.restore_level).toBe('sibling');
  });

  it('no rollout_timeout_s and no cohort_collection_timeout_s for a group-scored environment', () => {
    const e = rejection(input('sibling', [genrm()], { rolloutTimeoutS: null }));
    expect(e.problems).toEqual([expect.objectContaining({ key: 'async_rl.rollout_timeout_s' })]);
    expect(e.message).toMatch(/cohort_collection_timeout_s/);
    expect(rejection(input('sibling', [genrm()], { rolloutTimeoutS: null, cohortCollectionTimeoutS: null })).problems).toHaveLength(1);
    // Either deadline is enough: the server's cohort timeout, globally or for this environment.
    expect(() => resolveLevels(input('sibling', [genrm()], { rolloutTimeoutS: null, cohortCollectionTimeoutS: 120 }))).not.toThrow();
    expect(() => resolveLevels(input('sibling', [genrm()], { rolloutTimeoutS: null, cohortCollectionTimeoutS: { genrm_env: 120 } }))).not.toThrow();
    expect(rejection(input('sibling', [genrm()], { rolloutTimeoutS: null, cohortCollectionTimeoutS: { other_env: 120 } })).problems).toHaveLength(1);
    // The deadline the server itself reported through discovery counts too.
    expect(() => resolveLevels(input('sibling', [genrm({ cohort_collection_timeout_s: 1800 })], { rolloutTimeoutS: null }))).not.toThrow();
    // Ordinary environments need no deadline.
    expect(() => resolveLevels(input('turn', [env('counter_env')], { rolloutTimeoutS: null }))).not.toThrow();
  });

  it('an override naming an unknown agent', () => {
    const e = rejection(input('turn', [env('counter_env')], { agentOverrides: { ghost_agent: 'sibling' } }));
    expect(e.problems).toEqual([expect.objectContaining({ key: 'rollout_recovery.agent_target_level_overrides.ghost_agent' })]);
    expect(e.message).toMatch(/rollout_recovery\.agent_target_level_overrides\.ghost_agent: agent ghost_agent was not found by Gym discovery/);
  });

  it('an override finer than the target (agent and task source)', () => {
    const e = rejection(input('sibling', [env('counter_env')], { agentOverrides: { counter_env_agent: 'turn' } }));
    expect(e.message).toMatch(
      /rollout_recovery\.agent_target_level_overrides\.counter_env_agent: override turn is finer than rollout_recovery\.target_level sibling/,
    );
    const t = rejection(
      input('prompt_group', [env('counter_env')], { taskSourceOverrides: { counter: 'sibling' }, taskSourceEnvironments: { counter: 'counter_env' } }),
    );
    expect(t.problems).toEqual([expect.objectContaining({ key: 'rollout_recovery.task_source_target_level_overrides.counter' })]);
  });

  it('a task-source override for a task source with no discovered environment', () => {
    expect(rejection(input('turn', [env('counter_env')], { taskSourceOverrides: { weather: 'sibling' } })).message).toMatch(
      /task_source_target_level_overrides\.weather: task source weather is not configured/,
    );
    expect(
      rejection(input('turn', [env('counter_env')], { taskSourceOverrides: { weather: 'sibling' }, taskSourceEnvironments: { weather: 'weather_env' } }))
        .message,
    ).toMatch(/weather_env, which Gym discovery did not find/);
  });

  it('an override with an unknown level', () => {
    const e = rejection(input('turn', [env('counter_env')], { agentOverrides: { counter_env_agent: 'prefix' as TargetLevel } }));
    expect(e.message).toMatch(/agent_target_level_overrides\.counter_env_agent: unknown level "prefix"/);
  });

  it('lists every problem at once, each naming its key', () => {
    const e = rejection(
      input('turn', [genrm({ group_size: 2, verify_replayable: false })], {
        rolloutTimeoutS: null,
        agentOverrides: { ghost_agent: 'sibling' },
      }),
    );
    expect(e.problems.map((p) => p.key).sort()).toEqual([
      'async_rl.rollout_timeout_s',
      'grpo.num_generations_per_prompt',
      'rollout_recovery.agent_target_level_overrides.ghost_agent',
      'rollout_recovery.target_level',
    ]);
  });
});

describe('target levels: overrides (rule 6)', () => {
  const envs = () => [env('counter_env'), env('weather_env')];

  it('a coarser agent override applies to that agent only', () => {
    const r = resolveLevels(input('turn', envs(), { agentOverrides: { weather_env_agent: 'prompt_group' } }));
    expect(r.levels.weather_env).toMatchObject({
      recovery_granularity: 'prompt_group',
      restore_level: 'prompt_group',
      decided_by: 'agent_override',
      lowered: false,
    });
    expect(r.levels.counter_env).toMatchObject({ recovery_granularity: 'sibling', restore_level: 'turn', decided_by: 'target' });
    expect(r.warnings).toEqual([]);
  });

  it('an override equal to the target is allowed', () => {
    expect(one('sibling', env('counter_env'), { agentOverrides: { counter_env_agent: 'sibling' } }).level).toMatchObject({
      restore_level: 'sibling',
      decided_by: 'agent_override',
    });
  });

  it('a coarser task-source override applies to its environment', () => {
    const r = resolveLevels(
      input('turn', envs(), { taskSourceOverrides: { weather: 'sibling' }, taskSourceEnvironments: { counter: 'counter_env', weather: 'weather_env' } }),
    );
    expect(r.levels.weather_env).toMatchObject({ restore_level: 'sibling', decided_by: 'task_source_override' });
    expect(r.levels.counter_env).toMatchObject({ restore_level: 'turn', decided_by: 'target' });
  });

  it('resolution order: agent override, then task-source override, then the target', () => {
    const base = { taskSourceEnvironments: { weather: 'weather_env' }, taskSourceOverrides: { weather: 'sibling' as TargetLevel } };
    // Agent override wins over the task-source override (even when it is coarser or finer than it).
    expect(resolveLevels(input('turn', envs(), { ...base, agentOverrides: { weather_env_agent: 'prompt_group' } })).levels.weather_env).toMatchObject({
      restore_level: 'prompt_group',
      decided_by: 'agent_override',
    });
    expect(resolveLevels(input('turn', envs(), { ...base, agentOverrides: { weather_env_agent: 'turn' } })).levels.weather_env).toMatchObject({
      restore_level: 'turn',
      decided_by: 'agent_override',
    });
    // Without an agent override the task-source override decides; without either, the target.
    expect(resolveLevels(input('turn', envs(), base)).levels.weather_env).toMatchObject({ restore_level: 'sibling', decided_by: 'task_source_override' });
    expect(resolveLevels(input('turn', envs(), base)).levels.counter_env).toMatchObject({ restore_level: 'turn', decided_by: 'target' });
  });

  it('two task sources of one environment that disagree are rejected', () => {
    const e = rejection(
      input('turn', envs(), {
        taskSourceOverrides: { weather: 'sibling', weather_hard: 'prompt_group' },
        taskSourceEnvironments: { weather: 'weather_env', weather_hard: 'weather_env' },
      }),
    );
    expect(e.message).toMatch(/task_source_target_level_overrides\.weather_hard: conflicts with .*\.weather \(sibling\)/);
  });

  it('an override at sibling on a lowered environment removes the warning (nothing left to lower)', () => {
    const weak = env('weather_env', { supports_continuations: false });
    expect(one('turn', weak).warnings).toHaveLength(1);
    expect(one('turn', weak, { agentOverrides: { weather_env_agent: 'sibling' } })).toMatchObject({
      level: { restore_level: 'sibling', lowered: false },
      warnings: [],
    });
  });

  it('an agent override covers every environment of that agent', () => {
    const r = resolveLevels(
      input('turn', [env('a_env', { agent: 'simple_agent' }), env('b_env', { agent: 'simple_agent' })], { agentOverrides: { simple_agent: 'sibling' } }),
    );
    expect(Object.values(r.levels).map((l) => l.restore_level)).toEqual(['sibling', 'sibling']);
  });
});

describe('target levels: discovery input', () => {
  it('rejects an environment reported twice', () => {
    expect(rejection(input('turn', [env('counter_env'), env('counter_env')])).message).toMatch(/counter_env: environment reported twice/);
  });

  it('is deterministic and does not mutate its input', () => {
    const i = input('turn', [env('a_env', { supports_continuations: false }), genrm()], { agentOverrides: { genrm_agent: 'sibling' } });
    const copy = structuredClone(i);
    expect(resolveLevels(i)).toEqual(resolveLevels(i));
    expect(i).toEqual(copy);
  });
});
