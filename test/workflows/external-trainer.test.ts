// The trainer role (activities/trainer-role.ts) played by a stand-in for an external trainer
// (`trainer: external`): the training-run workflow on the time-skipping server drives it through
// the documented activities, with a Gym deployment that has no inference server for us to refit.
// Each step trains once from the expected version, anchors follow save_period with their
// Gym-restart fallback marker, and a trainer that lost its state says `trainer_behind`: the
// workflow sends the batches after its anchor again, the same batches, then goes on.
import { mkdtempSync, rmSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker, type WorkflowBundleWithSourceMap } from '@temporalio/worker';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readTrainBatch, writeGymRestartFallbackMarker, type TrainBatch } from '../../activities/trainer.js';
import type { TrainerRole } from '../../activities/trainer-role.js';
import type { RunConfig } from '../../protocol/run-config.js';
import { trainingRun } from '../../workflows/trainingRun.js';
import { createTimeSkippingEnv } from '../helpers/temporal.js';
import { FakeGym } from './fake-gym.js';
import { bundleUnderTest, installQuietRuntime, runConfig, terminateOpen, until } from './harness.js';

let env: TestWorkflowEnvironment;
let bundle: WorkflowBundleWithSourceMap;
let tmp: string;

beforeAll(async () => {
  installQuietRuntime();
  [env, bundle] = await Promise.all([createTimeSkippingEnv(), bundleUnderTest()]);
  tmp = mkdtempSync(join(tmpdir(), 'external-trainer-'));
});
afterAll(async () => {
  await env?.teardown();
  rmSync(tmp, { recursive: true, force: true });
});

/** An external trainer in miniature: a version counter for weights, its own anchor files. */
class StandInTrainer implements TrainerRole {
  version = 0;
  step = 0;
  readonly log: string[] = [];
  readonly batches: Array<{ step: number; batch: TrainBatch }> = [];
  /** Lose the in-memory state once, before the step with this number trains. */
  crashBeforeStep: number | undefined;

  async trainStep(input: Parameters<TrainerRole['trainStep']>[0]) {
    this.log.push(`train:${input.step}@v${input.expectedVersion}`);
    expect(input.trainer).toBe('external');
    expect(input.backendUrl).toBeUndefined();
    if (this.crashBeforeStep === input.step) {
      this.crashBeforeStep = undefined;
      const anchor = await this.newest(input.checkpointDir);
      this.version = anchor?.version ?? 0;
      this.step = anchor?.step ?? 0;
    }
    if (this.version < input.expectedVersion) {
      throw ApplicationFailure.nonRetryable(`behind: v${this.version}`, 'trainer_behind', { have: this.version, step: this.step });
    }
    this.batches.push({ step: input.step, batch: await readTrainBatch(input) });
    this.version = input.expectedVersion + 1;
    this.step = input.step;
    return {
      version: this.version,
      step: input.step,
      meanReward: 0,
      updatedSituations: [],
      seconds: 0,
      usedCalls: 0,
      droppedCalls: { notReturned: 0, superseded: 0, otherVersion: 0, unknown: 0 },
      contributingGroups: 0,
    };
  }

  async saveTrainerCheckpoint(input: Parameters<TrainerRole['saveTrainerCheckpoint']>[0]) {
    this.log.push(`save:${input.step}`);
    const dir = join(input.checkpointDir, `step_${input.step}`);
    await mkdir(dir, { recursive: true });
    const file = join(dir, 'external-trainer.json');
    await writeFile(file, JSON.stringify({ step: input.step, version: this.version, cursor: input.cursor }));
    await writeGymRestartFallbackMarker({ ...input, trainerVersion: this.version });
    return { anchor: `step_${input.step}`, path: file, version: this.version, sha256: '0'.repeat(64) };
  }

  async latestTrainerAnchor(input: { checkpointDir: string }) {
    const a = await this.newest(input.checkpointDir);
    return a ? { anchor: `step_${a.step}`, step: a.step, version: a.version, cursor: a.cursor, skipped: [] } : null;
  }

  async restoreTrainer(input: Parameters<TrainerRole['restoreTrainer']>[0]) {
    const a = await this.newest(input.checkpointDir);
    this.version = a?.version ?? 0;
    this.step = a?.step ?? 0;
    return { version: this.version, step: this.step, cursor: a?.cursor ?? 0, anchor: a ? `step_${a.step}` : 'bootstrap', skipped: [] };
  }

  private async newest(dir: string): Promise<{ step: number; version: number; cursor: number } | undefined> {
    for (let s = 50; s >= 1; s--) {
      try {
        return JSON.parse(await readFile(join(dir, `step_${s}`, 'external-trainer.json'), 'utf8')) as { step: number; version: number; cursor: number };
      } catch {
        /* no anchor of this step */
      }
    }
    return undefined;
  }
}

async function runWith(cfg: RunConfig, gym: FakeGym, trainer: StandInTrainer) {
  const role: TrainerRole = trainer;
  const worker = await Worker.create({
    connection: env.nativeConnection,
    taskQueue: cfg.run.task_queue,
    workflowBundle: bundle,
    // The external trainer's activities in place of ours, under the same names.
    activities: {
      ...gym.activities(),
      trainStep: role.trainStep.bind(role),
      saveTrainerCheckpoint: role.saveTrainerCheckpoint.bind(role),
      latestTrainerAnchor: role.latestTrainerAnchor.bind(role),
      restoreTrainer: role.restoreTrainer.bind(role),
    },
    maxHeartbeatThrottleInterval: '100 ms',
  });
  try {
    return await worker.runUntil(async () => {
      const handle = await env.client.workflow.start(trainingRun, { workflowId: cfg.run.name, taskQueue: cfg.run.task_queue, args: [{ config: cfg }] });
      await until(
        async () => {
          gym.finishAll();
          const d = await handle.describe();
          return d.status.name !== 'RUNNING';
        },
        'the run to close',
        60_000,
      );
      return handle.result();
    });
  } finally {
    await terminateOpen(env, cfg.run.name);
  }
}

describe('an external trainer in the trainer role', () => {
  it('trains every step once from the expected version and anchors every save_period step with its fallback marker; no inference server is needed', async () => {
    const dir = join(tmp, 'a');
    const cfg = runConfig('external-trainer-steps', {
      run: { checkpoint_dir: dir },
      grpo: { max_num_steps: 3 },
      trainer: { kind: 'external', enabled: true },
      checkpointing: { enabled: true, save_period: 2 },
    });
    const trainer = new StandInTrainer();
    const summary = await runWith(cfg, new FakeGym(), trainer);
    expect(summary).toMatchObject({ steps: 3, failedRollouts: 0, trainerVersion: 3 });
    expect(trainer.log).toEqual(['train:1@v0', 'train:2@v1', 'save:2', 'train:3@v2', 'save:3']);
    for (const s of [2, 3]) {
      const marker = JSON.parse(await readFile(join(dir, `step_${s}`, 'gym_restart_fallback.json'), 'utf8')) as {
        base_train_step: number;
        trainer_version: number;
      };
      expect([marker.base_train_step, marker.trainer_version]).toEqual([s, s]);
    }
  });

  it('a trainer that lost its state says trainer_behind: the batches after its anchor come again, the same ones, then the step', async () => {
    const cfg = runConfig('external-trainer-behind', {
      run: { checkpoint_dir: join(tmp, 'b') },
      grpo: { max_num_steps: 3 },
      trainer: { kind: 'external', enabled: true },
      checkpointing: { enabled: true, save_period: 2 },
    });
    const trainer = new StandInTrainer();
    trainer.crashBeforeStep = 2; // no anchor yet: it comes back at version 0
    const summary = await runWith(cfg, new FakeGym(), trainer);
    expect(summary).toMatchObject({ steps: 3, trainerVersion: 3 });
    expect(trainer.log).toEqual(['train:1@v0', 'train:2@v1', 'train:1@v0', 'train:2@v1', 'save:2', 'train:3@v2', 'save:3']);
    // The re-sent step 1 is the batch it had trained before it lost it.
    const step1 = trainer.batches.filter((b) => b.step === 1);
    expect(step1).toHaveLength(2);
    expect(step1[1]!.batch).toEqual(step1[0]!.batch);
  });

  it('tiny_grpo over a deployment without an inference server fails, naming it (the external trainer above needed none)', async () => {
    const cfg = runConfig('tiny-without-inference', { trainer: { kind: 'tiny_grpo', enabled: true } });
    const err = await runWith(cfg, new FakeGym(), new StandInTrainer()).catch((e: unknown) => e);
    expect(String((err as Error).cause ?? err)).toContain('the Gym deployment has no inference server to refit');
  });
});
