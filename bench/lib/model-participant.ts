// Shared by the model and storage benchmarks: a policy model participant in-process, and the
// ledger import case (restore of M episodes with two capture-ledger rows each into a fresh
// participant whose capture directory holds what a dead execution left): the import NeMo Gym
// reports 1.5 s for at 15,686 episodes.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { captureKey } from '../../protocol/ids.js';
import type { ChatMessage } from '../../protocol/openai.js';
import { taskOf } from '../../activities/dataset.js';
import { ControlPlane } from '../../servers/control/control-plane.js';
import type { CheckpointRecord } from '../../protocol/manifest.js';
import { writeRecords } from '../../servers/control/storage/writer.js';
import { fakeTokenIds, promptTextOf } from '../../servers/inference/reply.js';
import { ModelParticipant } from '../../servers/model/participant.js';
import { writeStagedTokens, TOKEN_STORE_FORMAT, stagingKeyOf } from '../../servers/model/token-store.js';
import { CaptureLedger } from '../../servers/model/capture-ledger.js';

const dirs: string[] = [];
export function tempDir(prefix: string): string {
  const d = mkdtempSync(path.join(os.tmpdir(), prefix));
  dirs.push(d);
  return d;
}

/** Removes every directory `tempDir` made. */
export function removeTempDirs(): void {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

export const deadline = (s = 600): number => Date.now() / 1000 + s;

/** A counter task's first prompt. */
export const m0 = taskOf({ taskset: 'counter', start: 1, target: 5 }, 'counter-bench').task_input.responses_create_params.input as ChatMessage[];

export async function newParticipant(captureDir: string): Promise<{ participant: ModelParticipant; plane: ControlPlane }> {
  const participant = await ModelParticipant.create({ serverName: 'policy_model', captureDir, generationCuts: false, backendRoot: 'http://127.0.0.1:9' });
  const plane = new ControlPlane({ instance: 'policy_model', hooks: participant.hooks });
  participant.attach(plane);
  return { participant, plane };
}

/** Runs `fn` over items with bounded concurrency. */
export async function forEachLimit<T>(items: readonly T[], limit: number, fn: (x: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) await fn(items[next++]!);
    }),
  );
}

/** Flushes dirty pages (best effort): a restore does not normally follow right after writing 10^5 files. */
export function settleDisk(): void {
  try {
    execFileSync('sync', { stdio: 'ignore' });
  } catch {
    /* no sync(1): measure as is */
  }
}

export async function timed<T>(fn: () => Promise<T>): Promise<[T, number]> {
  const t0 = performance.now();
  const v = await fn();
  return [v, (performance.now() - t0) / 1000];
}

/** The ledger import case: seconds to the restore reply (`import_s`) and to the files settled after it. */
export async function importCase(m: number): Promise<Record<string, number>> {
  const captureDir = tempDir('bench-import-capture-');
  const ckptDir = tempDir('bench-import-ckpt-');
  const episodes = Array.from({ length: m }, (_, i) => ({ rollout_id: `imp-${i}`, attempt: 0 }));
  // What the dead execution left, and the records its checkpoint holds: two calls per episode.
  const ledger = await CaptureLedger.open(captureDir);
  const records: CheckpointRecord[] = [];
  await forEachLimit(episodes, 64, async (e) => {
    const key = captureKey(e);
    const rows = [];
    let parent: string | null = null;
    for (let j = 0; j < 2; j++) {
      const id = `mc_${e.rollout_id}_${j}`;
      const row = {
        model_call_id: id,
        parent_call_id: parent,
        staging_key: stagingKeyOf(key, id),
        weight_version: 0,
        fingerprint: 'f'.repeat(64),
        fingerprint_version: 1,
        context_len: 2 + 2 * j,
        context_digest: 'c'.repeat(64),
        digest: 'd'.repeat(64),
        output_fingerprint: 'o'.repeat(64),
        mode: 'text',
        logical_request_id: 'a'.repeat(32),
        admitted_at: 1767225600.25 + j,
        response_id: `chatcmpl-${j}`,
      };
      rows.push(row);
      parent = id;
      await ledger.append(key, row);
      await writeStagedTokens(captureDir, {
        format: TOKEN_STORE_FORMAT,
        staging_key: row.staging_key,
        capture_key: key,
        model_call_id: id,
        weight_version: 0,
        prompt_token_ids: fakeTokenIds(promptTextOf(m0)),
        completion_token_ids: [12, 34, 56],
        completion_logprobs: [-0.5, 0, 0],
        finish_reason: 'tool_calls',
        complete: true,
      });
    }
    records.push({ episode_id: e, rows, generation_cuts: [] });
  });
  await writeRecords({ checkpointDir: ckptDir, kind: 'model', instance: 'policy_model', checkpointId: 'bench-import', records });
  const fresh = await newParticipant(captureDir);
  settleDisk();
  const [restored, restoreS] = await timed(() =>
    fresh.plane.restore({ checkpoint_id: 'bench-import-restore', deadline_ts: deadline(), checkpoint_dir: ckptDir, episode_ids: episodes }),
  );
  const [, settleS] = await timed(() => fresh.participant.settled());
  fresh.plane.close();
  if (restored.restored.length !== m) throw new Error(`imported ${restored.restored.length} of ${m}`);
  return { episodes: m, rows: 2 * m, import_s: restoreS, import_background_s: settleS };
}
