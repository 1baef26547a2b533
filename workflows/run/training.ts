// Training steps: sealed prompt groups taken `num_prompts_per_step` at a time, in dataset order,
// from the shards that hold them (each writes its part of the batch and drops the groups) into a
// trainer step (admission held by the weight-sync gate meanwhile); trainer anchors every
// `save_period` steps with their Gym-restart fallback; the catch-up of a trainer that lost its state.
import { ActivityFailure, ApplicationFailure, log } from '@temporalio/workflow';
import { batchPartFile, fallbackPartsDir, ledgerPartFile } from '../../protocol/controller.js';
import { allShards } from '../shard-asker.js';
import type { RunContext } from './context.js';
import { syncHolds } from './shards.js';

/** The inference backend to refit, as the trainer activity takes it: tiny_grpo needs one; other trainers refit their own. */
export function refitTarget(ctx: RunContext): { backendUrl?: string } {
  const url = ctx.backendUrl();
  if (!url && ctx.trainerKind === 'tiny_grpo') throw ApplicationFailure.nonRetryable('the Gym deployment has no inference server to refit', 'invariant_error');
  return url ? { backendUrl: url } : {};
}

function stepSummary(ctx: RunContext, step: number, version: number): string {
  if (ctx.trainerKind === 'none') return `rollout batch of step ${step}`;
  return `${ctx.trainerKind === 'tiny_grpo' ? 'GRPO' : 'training'} step ${step} (policy v${version} → v${version + 1})`;
}

function sendBatch(ctx: RunContext, step: number, version: number, batchFiles: string[], cursor: number) {
  const { cfg } = ctx;
  return ctx.storage.trainStep.executeWithOptions({ summary: stepSummary(ctx, step, version) }, [
    {
      run: cfg.run.name,
      checkpointDir: cfg.run.checkpoint_dir,
      trainer: ctx.trainerKind,
      ...refitTarget(ctx),
      gymRunDir: cfg.run.gym_run_dir,
      expectedVersion: version,
      step,
      batchFiles,
      cursor,
    },
  ]);
}

/**
 * Runs a trainer call; when the trainer lost its in-memory state (a worker restart), it comes back
 * from its newest anchor and says so (`trainer_behind`): redo the steps after that anchor from the
 * batches this run kept, then try again.
 */
async function withTrainerCatchUp<T>(ctx: RunContext, fn: () => Promise<T>): Promise<T> {
  for (let tries = 0; ; tries++) {
    try {
      return await fn();
    } catch (err) {
      const f = err instanceof ActivityFailure ? err.cause : undefined;
      if (!(f instanceof ApplicationFailure) || f.type !== 'trainer_behind' || tries > 1) throw err;
      const have = (f.details?.[0] as { step?: number } | undefined)?.step ?? 0;
      log.warn('trainer lost its state; replaying the batches after its anchor', { anchorStep: have });
      for (const t of ctx.st.trainedBatches.filter((b) => b.step > have)) await sendBatch(ctx, t.step, t.expectedVersion, t.batchFiles, t.cursor);
    }
  }
}

/** Trains every step whose groups are ready (none while a checkpoint is in progress: a snapshot binds one step). */
export async function trainReadyGroups(ctx: RunContext): Promise<void> {
  const { st, cfg } = ctx;
  if (ctx.checkpointRunning || ctx.training) return;
  ctx.training = true;
  try {
    for (;;) {
      // An anchor's trainer-boundary snapshot is taken at its step, before the next step trains.
      if (ctx.checkpointRunning || ctx.boundaryRequested) return;
      if (st.ready.length < cfg.grpo.num_prompts_per_step || st.steps >= cfg.grpo.max_num_steps) return;
      // Dataset order, as the groups were reserved.
      const groups = [...st.ready].sort((a, b) => a[0] - b[0]).slice(0, cfg.grpo.num_prompts_per_step);
      const step = st.steps + 1;
      const { batchFiles, mean } = await takeGroups(ctx, step, groups);
      if (cfg.trainer.enabled) {
        // Weight sync: admission closed by its own gate (the checkpoint gate is not touched).
        st.gates.weightSync = true;
        await syncHolds(ctx);
        try {
          const r = await withTrainerCatchUp(ctx, () => sendBatch(ctx, step, st.trainerVersion, batchFiles, st.cursor));
          st.trainerVersion = r.version;
        } finally {
          st.gates.weightSync = false;
          await syncHolds(ctx);
        }
      }
      st.steps = step;
      st.rewardPerStep.push(mean);
      // Kept to re-send to a trainer that lost its state; one that keeps none is never re-sent anything.
      if (ctx.ownsWeights) st.trainedBatches.push({ step, expectedVersion: st.trainerVersion - 1, batchFiles, cursor: st.cursor });
      else if (batchFiles.length > 0) await ctx.storage.removeControllerDir({ dir: batchDir(ctx, step) });
      log.info('training step', { step, reward: mean, policyVersion: st.trainerVersion });
      ctx.showInList();
      if (ctx.ownsWeights && cfg.checkpointing.enabled && (step % cfg.checkpointing.save_period === 0 || step === cfg.grpo.max_num_steps)) {
        await saveTrainerAnchor(ctx, step);
      }
    }
  } finally {
    // No wake() here: the main loop calls this every pass, and waking it would spin forever.
    ctx.training = false;
  }
}

function batchDir(ctx: RunContext, step: number): string {
  return batchPartFile(ctx.cfg.run.checkpoint_dir, step, 0).replace(/\/part-0\.json$/, '');
}

/**
 * Asks the shards holding `groups` for them: each writes its part of the step's batch (when a
 * trainer reads one) and drops them. Returns the parts' files, in shard order.
 */
async function takeGroups(ctx: RunContext, step: number, groups: Array<[index: number, shard: number]>): Promise<{ batchFiles: string[]; mean: number }> {
  const { st, cfg } = ctx;
  const byShard = new Map<number, number[]>();
  for (const [index, shard] of groups) byShard.set(shard, [...(byShard.get(shard) ?? []), index]);
  const shards = [...byShard.keys()].sort((a, b) => a - b);
  const withBatch = cfg.trainer.enabled;
  const answers = await ctx.shardsAsk.ask(shards, (k) => ({
    kind: 'consume',
    step,
    groups: byShard.get(k)!,
    batchFile: withBatch ? batchPartFile(cfg.run.checkpoint_dir, step, k) : null,
  }));
  const failed = answers.filter((a) => a.error !== undefined);
  if (failed.length > 0)
    throw ApplicationFailure.nonRetryable(
      `training step ${step}: shards could not hand over their groups: ${failed.map((a) => a.error).join('; ')}`,
      'invariant_error',
    );
  const taken = new Set(groups.map(([index]) => index));
  st.ready = st.ready.filter(([index]) => !taken.has(index));
  const live = answers.reduce((n, a) => n + (a.live ?? 0), 0);
  const mean = live ? answers.reduce((n, a) => n + (a.rewardSum ?? 0), 0) / live : 0;
  return { batchFiles: answers.flatMap((a) => (a.batchFile ? [a.batchFile] : [])), mean };
}

/**
 * Trainer anchor durable → fallback marker → a Gym-aware snapshot at that anchor (controller.md
 * §2.6). Each shard first writes its ledger part for the marker; anchor and marker are then one
 * activity, so a run lost between them cannot leave an anchor that a cold start must refuse.
 */
async function saveTrainerAnchor(ctx: RunContext, step: number): Promise<void> {
  const { st, cfg } = ctx;
  const dir = fallbackPartsDir(cfg.run.checkpoint_dir, step);
  const parts = await ctx.shardsAsk.ask(allShards(st.shards), () => ({ kind: 'ledgerPart', dir }));
  const failed = parts.filter((a) => a.error !== undefined);
  if (failed.length > 0)
    throw ApplicationFailure.nonRetryable(
      `trainer anchor step_${step}: shards could not write their ledger parts: ${failed.map((a) => a.error).join('; ')}`,
      'invariant_error',
    );
  const gymRestartFallback = { topologyFingerprint: st.topology?.fingerprint ?? '', ledgerParts: { dir, files: allShards(st.shards).map(ledgerPartFile) } };
  await withTrainerCatchUp(ctx, () =>
    ctx.storage.saveTrainerCheckpoint.executeWithOptions({ summary: `trainer checkpoint step_${step} and its Gym-restart fallback` }, [
      { run: cfg.run.name, checkpointDir: cfg.run.checkpoint_dir, step, cursor: st.cursor, gymRestartFallback },
    ]),
  );
  st.lastAnchorStep = step;
  // The batches before the anchor are in it now; so are the fallback parts (merged into its marker).
  const covered = st.trainedBatches.filter((b) => b.step <= step);
  st.trainedBatches = st.trainedBatches.filter((b) => b.step > step);
  for (const b of covered) await ctx.storage.removeControllerDir({ dir: batchDir(ctx, b.step) });
  await ctx.storage.removeControllerDir({ dir });
  ctx.boundaryRequested = true;
}
