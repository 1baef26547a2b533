// Training steps: finished prompt groups consumed `num_prompts_per_step` at a time into a trainer
// step (admission held by the weight-sync gate meanwhile), trainer anchors every `save_period`
// steps, and the catch-up of a trainer that lost its state.
import { ActivityFailure, ApplicationFailure, log, upsertMemo } from '@temporalio/workflow';
import type { TrainBatch } from '../../activities/trainer.js';
import { packJson } from '../../protocol/packed-json.js';
import * as D from '../deadlines.js';
import * as L from '../ledger.js';
import type { RunContext } from './context.js';

const WEIGHT_SYNC_HOLDER = 'weight-sync';

/** The trajectory of each sibling: its reward and the attempts whose model calls it used. */
function batchOf(groups: L.PromptGroup[]): TrainBatch {
  return groups.map((g) => ({
    group_id: g.group_id,
    siblings: g.siblings.map((s) => {
      const a = L.currentAttempt(s);
      return { rollout_id: s.rollout_id, reward: a.reward ?? 0, mask: a.mask_sample ?? true, captureKeys: L.lineageKeys(s) };
    }),
  }));
}

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

function sendBatch(ctx: RunContext, step: number, version: number, batch: TrainBatch, cursor: number) {
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
      batch,
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
      for (const t of ctx.st.trainedBatches.filter((b) => b.step > have)) await sendBatch(ctx, t.step, t.expectedVersion, t.batch, t.cursor);
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
      const ready = L.readyGroups(st.ledger);
      if (ready.length < cfg.grpo.num_prompts_per_step || st.steps >= cfg.grpo.max_num_steps) return;
      const groups = ready.slice(0, cfg.grpo.num_prompts_per_step);
      const batch = batchOf(groups);
      const live = batch.flatMap((g) => g.siblings).filter((x) => !x.mask);
      const mean = live.length ? live.reduce((a, x) => a + x.reward, 0) / live.length : 0;
      const step = st.steps + 1;
      if (cfg.trainer.enabled) {
        // Weight sync: admission closed by its own gate (the checkpoint gate is not touched).
        st.gates.weightSync = true;
        D.hold(st.deadlines, WEIGHT_SYNC_HOLDER);
        try {
          const r = await withTrainerCatchUp(ctx, () => sendBatch(ctx, step, st.trainerVersion, batch, st.ledger.cursor));
          st.trainerVersion = r.version;
        } finally {
          st.gates.weightSync = false;
          D.release(st.deadlines, WEIGHT_SYNC_HOLDER);
        }
      }
      for (const g of groups) {
        L.consumeGroup(st.ledger, g.group_id);
        st.forgetQueue.push(...L.rolloutIds(g));
      }
      st.steps = step;
      st.rewardPerStep.push(mean);
      // Kept to re-send to a trainer that lost its state; one that keeps none is never re-sent anything.
      if (ctx.ownsWeights) st.trainedBatches.push({ step, expectedVersion: st.trainerVersion - 1, batch, cursor: st.ledger.cursor });
      log.info('training step', { step, reward: mean, policyVersion: st.trainerVersion });
      await upsertMemo({ steps: st.steps, policyVersion: st.trainerVersion });
      if (ctx.ownsWeights && cfg.checkpointing.enabled && (step % cfg.checkpointing.save_period === 0 || step === cfg.grpo.max_num_steps)) {
        await saveTrainerAnchor(ctx, step);
      }
    }
  } finally {
    // No wake() here: the main loop calls this every pass, and waking it would spin forever.
    ctx.training = false;
  }
}

/**
 * Trainer anchor durable → fallback marker → a Gym-aware snapshot at that anchor (controller.md
 * §2.6). Anchor and marker are one activity, so a run lost between them cannot leave an anchor
 * that a cold start must refuse.
 */
async function saveTrainerAnchor(ctx: RunContext, step: number): Promise<void> {
  const { st, cfg } = ctx;
  const gymRestartFallback = { topologyFingerprint: st.topology?.fingerprint ?? '', ledger: packJson(st.ledger) };
  await withTrainerCatchUp(ctx, () =>
    ctx.storage.saveTrainerCheckpoint.executeWithOptions({ summary: `trainer checkpoint step_${step} and its Gym-restart fallback` }, [
      { run: cfg.run.name, checkpointDir: cfg.run.checkpoint_dir, step, cursor: st.ledger.cursor, gymRestartFallback },
    ]),
  );
  st.lastAnchorStep = step;
  // The batches before the anchor are in it now.
  st.trainedBatches = st.trainedBatches.filter((b) => b.step > step);
  ctx.boundaryRequested = true;
}
