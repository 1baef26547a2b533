// A run's start: the recovery levels resolved from discovery, and a cold `restore_mode: latest`
// start of a new run on an existing checkpoint directory (it takes over the newest trainer anchor
// and its snapshot, or the anchor's Gym-restart fallback).
import { ApplicationFailure, log } from '@temporalio/workflow';
import type { GymTopology } from '../../protocol/controller.js';
import { resolveLevels, TargetLevelError, type EnvironmentCapabilities } from '../target-levels.js';
import type { RunContext } from './context.js';
import { refitTarget } from './training.js';

/**
 * A new run on an existing checkpoint directory (`restore_mode: latest`, controller.md §3.7, §4):
 * the newest valid trainer anchor, then that anchor's newest snapshot that validates against the
 * discovered topology — or, without one, the anchor's Gym-restart fallback (keep sealed siblings,
 * start every unfinished one over). The rollout shards take their slices of its ledger when they
 * start, and check them before anything is admitted; the Gym restore itself is the recovery pass
 * that runs before the first dispatch. True when there is something to recover.
 */
export async function coldStart(ctx: RunContext, topology: GymTopology): Promise<boolean> {
  const { st, cfg } = ctx;
  const checkpointDir = cfg.run.checkpoint_dir;
  const refuse = (message: string): ApplicationFailure => ApplicationFailure.nonRetryable(`restore_mode latest: ${message}`, 'invalid_restore');
  const anchor = ctx.ownsWeights ? await ctx.storage.latestTrainerAnchor({ checkpointDir }) : null;
  const snap = await ctx.storage.latestSnapshot({ checkpointDir, fingerprint: topology.fingerprint, ...(anchor ? { anchor: anchor.anchor } : {}) });
  let step: number;
  let version: number;
  if (snap) {
    if (anchor && snap.manifest.base_train_step !== anchor.step) {
      throw refuse(`snapshot ${snap.dir} is at step ${snap.manifest.base_train_step}, not at its anchor ${anchor.anchor}`);
    }
    st.loadFrom = { dir: snap.dir, files: snap.manifest.ledger_parts.map((p) => p.file) };
    st.cursor = snap.manifest.dataloader_cursor;
    step = snap.manifest.base_train_step;
    version = snap.manifest.trainer_version;
  } else if (anchor) {
    const fallback = await ctx.storage.readGymRestartFallback({ checkpointDir, anchor: anchor.anchor });
    if (!fallback)
      throw refuse(
        `trainer anchor ${anchor.anchor} in ${checkpointDir} has neither a snapshot nor a Gym-restart fallback marker; refusing to start (use restore_mode: none or a new checkpoint_dir)`,
      );
    if (fallback.gym_topology_fingerprint !== topology.fingerprint) {
      throw refuse(
        `the Gym topology of ${anchor.anchor} (${fallback.gym_topology_fingerprint.slice(0, 12)}…) differs from the discovered one (${topology.fingerprint.slice(0, 12)}…)`,
      );
    }
    st.loadFrom = { marker: fallback.file };
    st.cursor = fallback.cursor;
    step = anchor.step;
    version = anchor.version;
  } else {
    return false; // nothing to take over: a fresh start
  }
  if (anchor) {
    const r = await ctx.storage.restoreTrainer({ run: cfg.run.name, checkpointDir, ...refitTarget(ctx), anchor: anchor.anchor, adopt: true });
    version = r.version;
    st.lastAnchorStep = anchor.step;
  }
  st.steps = step;
  st.trainerVersion = version;
  // Groups of the steps before it were trained; the shards count the sealed ones they take over.
  st.completedRollouts = step * cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt;
  st.lastSnapshot = snap?.dir ?? null;
  st.restoredFrom = { anchor: anchor?.anchor ?? null, snapshotDir: snap?.dir ?? null, step, trainerVersion: version, skipped: snap?.skipped ?? [] };
  st.recoveryNeeded = true;
  log.info('cold start: taking over an existing checkpoint', { ...st.restoredFrom, skipped: st.restoredFrom.skipped.length });
  return true;
}

/**
 * Target-level resolution at setup (controller.md §5.6, §5.7): each configured environment gets
 * the finest level at or below the target that discovery says it supports; a combination that
 * fails ends the run here, naming the config keys, before any work is admitted.
 */
export function setupLevels(ctx: RunContext, topology: GymTopology): void {
  const { st, cfg } = ctx;
  const environmentOf = (taskset: string): string => cfg.grpo.environments[taskset] ?? `${taskset}_env`;
  const names = [...new Set(cfg.grpo.tasksets.map(environmentOf))];
  const unreported: string[] = [];
  const environments: EnvironmentCapabilities[] = names.map((name) => {
    const caps = topology.environments?.[name];
    if (caps) return caps;
    unreported.push(name);
    // Not reported (not a participant, or a server without our capabilities): assume the least.
    return {
      environment: name,
      agent: '',
      supports_continuations: false,
      resources_checkpoint_mode: 'restart_only',
      verify_replayable: false,
      group_size: null,
    };
  });
  try {
    const r = resolveLevels({
      target: cfg.rollout_recovery.target_level,
      environments,
      agentOverrides: cfg.rollout_recovery.agent_target_level_overrides,
      taskSourceOverrides: cfg.rollout_recovery.task_source_target_level_overrides,
      taskSourceEnvironments: Object.fromEntries(cfg.grpo.tasksets.map((t) => [t, environmentOf(t)])),
      numGenerationsPerPrompt: cfg.grpo.num_generations_per_prompt,
      rolloutTimeoutS: cfg.async_rl.rollout_timeout_s,
    });
    st.levels = r.levels;
    st.levelWarnings = [...unreported.map((n) => `environment ${n}: not reported by Gym discovery; assumed restart-only without continuations`), ...r.warnings];
  } catch (err) {
    if (err instanceof TargetLevelError) {
      throw ApplicationFailure.nonRetryable(err.message, 'invalid_recovery_setup', { problems: err.problems });
    }
    throw err;
  }
  for (const w of st.levelWarnings) log.warn(w);
  log.info('recovery levels resolved', {
    levels: Object.fromEntries(Object.values(st.levels).map((l) => [l.environment, `${l.recovery_granularity}/${l.restore_level}`])),
  });
}
