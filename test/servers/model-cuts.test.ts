// Generation cuts end to end in one process (participants.md §5.5–5.6): the model participant cuts
// an undelivered call at prepare through the tiny-policy backend's cut service, exports the cut,
// and after a restore the replacement's matching call continues the prefix (the backend decodes
// only the rest). Constrained calls are skipped; a failing cut only costs a regeneration.
import { existsSync, readFileSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { readRecords } from '../../servers/control/storage/reader.js';
import { ledgerPath } from '../../servers/model/capture-ledger.js';
import {
  afterToolRound,
  chat,
  closeFixtures,
  closePool,
  control,
  deadline,
  ep,
  pending,
  startBackend,
  startModel,
  stopModel,
  weatherStart,
  type TestBackend,
  type TestModel,
} from './model-fixtures.js';
import { waitFor } from '../helpers/wait.js';
import { tempDir } from '../helpers/temp-dir.js';

afterEach(async () => {
  await closeFixtures();
});
afterAll(async () => {
  await closePool();
});

const ledgerRows = (m: { captureDir: string }, key: string): any[] =>
  existsSync(ledgerPath(m.captureDir, key))
    ? readFileSync(ledgerPath(m.captureDir, key), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l))
    : [];

interface Checkpointed {
  backend: TestBackend;
  model: TestModel;
  dir: string;
  m1: any;
  prepared: any;
  committed: any;
  record: any;
  answer: any;
}

/** Call 0 delivered; call 1 (the long answer) still decoding when checkpoint c1 prepares; then a crash. */
async function checkpointMidGeneration(opts: { cuts: boolean; extra?: Record<string, unknown>; breakCuts?: boolean }): Promise<Checkpointed> {
  const backend = await startBackend({ tokenDelayMs: 25 });
  if (opts.breakCuts) backend.state.cuts.cut = () => ({ checkpoint_id: 'nope' }) as never; // an invalid receipt
  const model = await startModel(backend, { cuts: opts.cuts });
  const dir = tempDir('model-cuts');
  const first = await chat(model, 'r', weatherStart());
  const m1 = afterToolRound(weatherStart(), first.body);
  const lost = pending(chat(model, 'r', m1, opts.extra ?? {}));
  await waitFor('call 1 decoding', () => (backend.calls()[1]?.decoded_tokens ?? 0) >= 6);
  const prep = await control(model, 'prepare', { checkpoint_id: 'c1', deadline_ts: deadline() });
  expect(prep.body.phase).toBe('prepared');
  const c = await control(model, 'commit', { checkpoint_id: 'c1', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] });
  expect(c.status).toBe(200);
  const [record] = (await readRecords({ checkpointDir: dir, kind: 'model', instance: 'policy_model', scope: new Set(['r']) })).records as any[];
  // The full answer, as the original call would have delivered it.
  await waitFor('call 1 decoded', () => backend.calls()[1]?.returned);
  await stopModel(model);
  await lost.done;
  const answer = backend.calls()[1]!;
  return { backend, model, dir, m1, prepared: prep.body, committed: c.body, record, answer };
}

async function restoreFresh(cp: Checkpointed, cuts: boolean): Promise<TestModel> {
  const fresh = await startModel(cp.backend, { cuts, captureDir: cp.model.captureDir });
  const r = await control(fresh, 'restore', { checkpoint_id: 'rs1', deadline_ts: deadline(), checkpoint_dir: cp.dir, episode_ids: [ep('r')] });
  expect(r.status).toBe(200);
  return fresh;
}

describe('generation cuts', { timeout: 30_000 }, () => {
  it('an undelivered call still decoding is cut at prepare; after a crash the replacement continues its prefix', async () => {
    const cp = await checkpointMidGeneration({ cuts: true });
    expect(cp.prepared.report.counts).toMatchObject({ inflight: 1, cut: 1, cut_failed: 0, cut_skipped: 0 });
    const cutRounds = [...cp.backend.state.cuts.rounds];
    const cutCallId = cp.backend.calls()[1]!.model_call_id!;
    expect(cutRounds).toEqual([[cutCallId]]);
    const [cut] = cp.record.generation_cuts;
    expect(cut).toMatchObject({
      model_call_id: cutCallId,
      continuation: { source_capture_key: 'r', source_model_call_id: cutCallId, staging_keys: [`__generation_cut__/r/${cutCallId}`] },
    });
    expect(cut.continuation.prefix_token_count).toBeGreaterThanOrEqual(6);
    expect(cp.committed.staging_keys).toContain(`__generation_cut__/r/${cutCallId}`);
    expect(cp.committed.staging_keys_by_episode.r).toContain(`__generation_cut__/r/${cutCallId}`);

    const fresh = await restoreFresh(cp, true);
    expect((await control(fresh, 'status')).body.restored_generation_cuts).toEqual(['r-a1']);
    await control(fresh, 'resume', { checkpoint_id: 'rs1', deadline_ts: deadline() });
    const again = await chat(fresh, 'r-a1', cp.m1);
    expect(again.status).toBe(200);
    const log = cp.backend.calls()[2]!;
    expect(log).toMatchObject({ capture_key: 'r-a1', continued_from: cutCallId, reused_prefix_tokens: cut.continuation.prefix_token_count });
    // Only the rest was decoded, and it is the same answer.
    expect(log.decoded_tokens).toBe(cp.answer.decoded_tokens - cut.continuation.prefix_token_count);
    expect(again.body.choices[0].message.content).toBe('I checked the weather for you.');
    // The cut served its purpose; the lineage names it.
    expect((await control(fresh, 'status')).body.restored_generation_cuts).toEqual([]);
    const rows = ledgerRows(fresh, 'r-a1');
    expect(rows[1]).toMatchObject({ parent_call_id: rows[0].model_call_id, generation_cut_source: cutCallId });
  });

  it('with cuts off the replacement regenerates from scratch', async () => {
    const cp = await checkpointMidGeneration({ cuts: false });
    expect(cp.prepared.report.counts).toMatchObject({ inflight: 1, cut: 0, cut_failed: 0, cut_skipped: 0 });
    expect(cp.record.generation_cuts).toEqual([]);
    expect(cp.backend.state.cuts.rounds).toEqual([]);
    const fresh = await restoreFresh(cp, false);
    await control(fresh, 'resume', { checkpoint_id: 'rs1', deadline_ts: deadline() });
    const again = await chat(fresh, 'r-a1', cp.m1);
    expect(again.status).toBe(200);
    const log = cp.backend.calls()[2]!;
    expect(log.continued_from).toBeUndefined();
    expect(log.decoded_tokens).toBe(cp.answer.decoded_tokens);
  });

  it('constrained decoding is never cut (cut_skipped) and regenerates', async () => {
    const cp = await checkpointMidGeneration({ cuts: true, extra: { tool_choice: 'required' } });
    expect(cp.prepared.report.counts).toMatchObject({ inflight: 1, cut: 0, cut_skipped: 1 });
    expect(cp.record.generation_cuts).toEqual([]);
    expect(cp.backend.state.cuts.rounds).toEqual([]);
  });

  it('a failing cut service only costs the regeneration of its calls (cut_failed); prepare still succeeds', async () => {
    const cp = await checkpointMidGeneration({ cuts: true, breakCuts: true });
    expect(cp.prepared.report.counts).toMatchObject({ inflight: 1, cut: 0, cut_failed: 1 });
    expect(cp.record.generation_cuts).toEqual([]);
  });

  it('a restored cut is continued only by a call with the same request digest', async () => {
    const cp = await checkpointMidGeneration({ cuts: true });
    const fresh = await restoreFresh(cp, true);
    await control(fresh, 'resume', { checkpoint_id: 'rs1', deadline_ts: deadline() });
    const other = await chat(fresh, 'r-a1', cp.m1, { tools: [{ type: 'function', function: { name: 'get_weather' } }] });
    expect(other.status).toBe(200);
    expect(cp.backend.calls()[2]!.continued_from).toBeUndefined();
    expect((await control(fresh, 'status')).body.restored_generation_cuts).toEqual(['r-a1']);
    // A second checkpoint re-exports the still unclaimed restored cut.
    await control(fresh, 'prepare', { checkpoint_id: 'c2', deadline_ts: deadline() });
    const dir2 = tempDir('model-cuts');
    const c2 = await control(fresh, 'commit', { checkpoint_id: 'c2', deadline_ts: deadline(), checkpoint_dir: dir2, episode_ids: [ep('r', 1)] });
    expect(c2.status).toBe(200);
    const [rec] = (await readRecords({ checkpointDir: dir2, kind: 'model', instance: 'policy_model', scope: new Set(['r-a1']) })).records as any[];
    expect(rec.generation_cuts).toEqual(cp.record.generation_cuts);
  });

  it('the cut request gets half the remaining prepare time: a backend that never answers costs only that', async () => {
    // A backend that takes every call and answers nothing (a generation that runs on; a cut service that hangs).
    const open: ServerResponse[] = [];
    const silent = createServer((req, res) => {
      req.resume();
      open.push(res);
    });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    try {
      const model = await startModel({ url }, { cuts: true });
      const call = pending(chat(model, 'h1', weatherStart()));
      await waitFor('the call reached the backend', () => open.length === 1);
      const t0 = Date.now();
      const prep = await control(model, 'prepare', { checkpoint_id: 'c1', deadline_ts: Date.now() / 1000 + 2 });
      const took = Date.now() - t0;
      expect(prep.body.phase).toBe('prepared');
      expect(prep.body.report.counts).toMatchObject({ inflight: 1, cut: 0, cut_failed: 1 });
      expect(took).toBeGreaterThanOrEqual(800);
      expect(took).toBeLessThan(1_900);
      await control(model, 'resume', { checkpoint_id: 'c1', deadline_ts: deadline() });
      await stopModel(model);
      await call.done;
    } finally {
      for (const res of open) res.destroy();
      silent.closeAllConnections();
      await new Promise((r) => silent.close(r));
    }
  });
});
