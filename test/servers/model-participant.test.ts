// The policy model as a checkpoint participant (participants.md §5.2–5.4), against the real
// tiny-policy backend, both in this process on 127.0.0.1: the admission gate, held responses,
// streaming blockers, the capture ledger and token store, export, restore, retire, forget.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { readRecords } from '../../servers/control/storage/reader.js';
import { ledgerPath } from '../../servers/model/capture-ledger.js';
import { captureDirOf } from '../../servers/model/module.js';
import { listStagingKeys, readStagedTokens } from '../../servers/model/token-store.js';
import {
  afterToolRound,
  AUTH,
  chat,
  closeFixtures,
  closePool,
  control,
  deadline,
  ep,
  http,
  modelContext,
  pending,
  startBackend,
  startModel,
  stopModel,
  weatherStart,
  type TestModel,
} from './model-fixtures.js';
import { sleep, waitFor } from '../helpers/wait.js';
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

async function prepare(m: TestModel, id: string, s = 10): Promise<any> {
  const r = await control(m, 'prepare', { checkpoint_id: id, deadline_ts: deadline(s) });
  expect(r.status).toBe(200);
  return r.body;
}

async function commit(m: TestModel, id: string, dir: string, scope: unknown): Promise<any> {
  return control(m, 'commit', { checkpoint_id: id, deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: scope });
}

async function resume(m: TestModel, id: string): Promise<void> {
  const r = await control(m, 'resume', { checkpoint_id: id, deadline_ts: deadline() });
  expect(r.status).toBe(200);
}

async function status(m: TestModel): Promise<any> {
  return (await control(m, 'status')).body;
}

describe('admission gate', { timeout: 20_000 }, () => {
  it('mounts the participant of kind model; calls without a prefix belong to no episode', async () => {
    const backend = await startBackend();
    const model = await startModel(backend);
    const s = await status(model);
    expect(s).toMatchObject({ kind: 'model', instance: 'policy_model', phase: 'idle', restored_generation_cuts: [], restored_pending: [], waiting_calls: 0 });
    expect(s.report.counts).toEqual({ inflight: 0, held: 0, cut: 0, cut_failed: 0, cut_skipped: 0 });
    const r = await chat(model, undefined, weatherStart());
    expect(r.status).toBe(200);
    expect(backend.calls()[0]!.admission).toBeUndefined();
    expect(await listStagingKeys(model.captureDir, 'anonymous')).toEqual([]);
    // Once served, it will not take a restore.
    const restore = await control(model, 'restore', {
      checkpoint_id: 'rs',
      deadline_ts: deadline(),
      checkpoint_dir: tempDir('model-participant'),
      episode_ids: [],
    });
    expect(restore.status).toBe(409);
    expect(restore.body.error.code).toBe('checkpoint_error');
  });

  it('a call arriving while a checkpoint is open waits unadmitted (not counted), then runs after resume', async () => {
    const backend = await startBackend();
    const model = await startModel(backend);
    expect((await prepare(model, 'c1')).phase).toBe('prepared');
    const call = pending(chat(model, 'w1', weatherStart()));
    const anon = pending(chat(model, undefined, weatherStart()));
    await waitFor('two waiting calls', () => model.participant.waiting === 2);
    await sleep(50);
    expect(backend.calls()).toHaveLength(0);
    expect(await status(model)).toMatchObject({ waiting_calls: 2, report: { counts: { inflight: 0 } } });
    await resume(model, 'c1');
    await call.done;
    await anon.done;
    expect(call.reply!.status).toBe(200);
    expect(anon.reply!.status).toBe(200);
    expect(backend.calls()).toHaveLength(2);
  });

  it('prepare never waits for a generation: a reply arriving while prepared is held; commit leaves it out; resume delivers it', async () => {
    const backend = await startBackend();
    const model = await startModel(backend);
    const dir = tempDir('model-participant');
    const first = await chat(model, 'w1', weatherStart());
    expect(first.status).toBe(200);
    const m1 = afterToolRound(weatherStart(), first.body);
    backend.state.holds.place({ after_calls: 1 });
    const second = pending(chat(model, 'w1', m1));
    await waitFor('the backend holds call 1', () => backend.state.holds.waiting === 1);

    const prep = await prepare(model, 'c1');
    expect(prep.phase).toBe('prepared');
    expect(prep.report).toMatchObject({ ready: true, blockers: [], counts: { inflight: 1, held: 0 } });
    backend.state.holds.release();
    await waitFor('the reply is held by the model server', () => model.participant.held === 1);
    await sleep(50);
    expect(second.settled).toBe(false);
    expect((await status(model)).report).toMatchObject({ ready: true, counts: { inflight: 1, held: 1 } });

    const c = await commit(model, 'c1', dir, [ep('w1')]);
    expect(c.status).toBe(200);
    const records = (await readRecords({ checkpointDir: dir, kind: 'model', instance: 'policy_model', scope: new Set(['w1']) })).records as any[];
    expect(records).toHaveLength(1);
    // Only the delivered call: the held one has no row yet.
    expect(records[0].rows.map((r: any) => r.parent_call_id)).toEqual([null]);
    expect(records[0].generation_cuts).toEqual([]);
    const firstRow = records[0].rows[0];
    expect(c.body.staging_keys).toEqual([firstRow.staging_key]);
    expect(c.body.staging_keys_by_episode).toEqual({ w1: [firstRow.staging_key] });
    expect(firstRow).toMatchObject({ staging_key: `w1/${firstRow.model_call_id}`, weight_version: 0, mode: 'text' });

    await resume(model, 'c1');
    await second.done;
    expect(second.reply!.status).toBe(200);
    const rows = ledgerRows(model, 'w1');
    expect(rows.map((r) => r.parent_call_id)).toEqual([null, firstRow.model_call_id]);
    // The backend saw the participant's admission: model call ID and resolved parent.
    expect(backend.calls()[1]!.admission).toMatchObject({ model_call_id: rows[1].model_call_id, parent_call_id: firstRow.model_call_id, capture_key: 'w1' });
    // Tokens staged for both calls.
    const staged = await readStagedTokens(model.captureDir, rows[1].staging_key);
    expect(staged).toMatchObject({ capture_key: 'w1', model_call_id: rows[1].model_call_id, weight_version: 0, complete: true, finish_reason: 'stop' });
    expect(staged!.completion_token_ids).toEqual(second.reply!.body.choices[0].token_ids);
    expect(staged!.prompt_token_ids).toEqual(second.reply!.body.prompt_token_ids);
    expect(staged!.completion_logprobs).toHaveLength(staged!.completion_token_ids!.length);
  });

  it('a response already streaming blocks prepare until it has been sent', async () => {
    const backend = await startBackend({ tokenDelayMs: 25 });
    const model = await startModel(backend);
    const stream = pending(chat(model, 's1', weatherStart(), { stream: true }));
    await waitFor('the stream started', () => backend.calls()[0]?.decoded_tokens);
    await waitFor('the response started', async () => (await status(model)).report.blockers.length === 1);
    const early = await control(model, 'prepare', { checkpoint_id: 'c1', deadline_ts: deadline(0.05) });
    expect(early.body.phase).toBe('preparing');
    expect(early.body.report).toMatchObject({ ready: false, blockers: ['s1'], blocker_count: 1 });
    const prep = await prepare(model, 'c1');
    expect(prep.phase).toBe('prepared');
    await stream.done;
    expect(stream.reply!.status).toBe(200);
    expect(stream.reply!.body).toContain('[DONE]');
    await resume(model, 'c1');
    // A streamed call's tokens are staged once the stream ended.
    const [row] = ledgerRows(model, 's1');
    const staged = await waitFor('tokens staged', () => readStagedTokens(model.captureDir, row.staging_key));
    expect(staged.completion_token_ids!.length).toBe(backend.calls()[0]!.decoded_tokens);
    expect(row.weight_version).toBe(0);
  });

  it('a commit without a scope fails as an export (export_failed)', async () => {
    const backend = await startBackend();
    const model = await startModel(backend);
    await prepare(model, 'c1');
    const r = await commit(model, 'c1', tempDir('model-participant'), null);
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe('export_failed');
    expect(r.body.error.detail).toMatch(/explicit commit scope/);
  });

  it('a failed ledger write poisons the call: no answer is sent', async () => {
    const backend = await startBackend();
    const model = await startModel(backend);
    // A directory where the ledger file should be: every write to it fails.
    mkdirSync(ledgerPath(model.captureDir, 'p1'), { recursive: true });
    await expect(chat(model, 'p1', weatherStart())).rejects.toThrow();
    expect(backend.calls()).toHaveLength(1);
    await waitFor('the ticket ended', () => model.participant.inflight === 0);
  });
});

describe('restore and retire', { timeout: 30_000 }, () => {
  /** One delivered call and one undelivered (held by the backend) at checkpoint c1; then the server dies. */
  async function checkpointWithUndelivered(): Promise<{
    dir: string;
    captureDir: string;
    backend: Awaited<ReturnType<typeof startBackend>>;
    saved: any;
    m1: any;
  }> {
    const backend = await startBackend();
    const model = await startModel(backend);
    const dir = tempDir('model-participant');
    const first = await chat(model, 'r', weatherStart());
    const m1 = afterToolRound(weatherStart(), first.body);
    backend.state.holds.place({ after_calls: 1 });
    const lost = pending(chat(model, 'r', m1));
    await waitFor('held at the backend', () => backend.state.holds.waiting === 1);
    await prepare(model, 'c1');
    expect((await commit(model, 'c1', dir, [ep('r')])).status).toBe(200);
    const [saved] = ledgerRows(model, 'r');
    await stopModel(model);
    await lost.done;
    backend.state.holds.release();
    return { dir, captureDir: model.captureDir, backend, saved, m1 };
  }

  it('a fresh server imports rows under N+1 (stamped with capture_key) and retires attempt N; lineage continues from the saved call', async () => {
    const { dir, captureDir, backend, saved, m1 } = await checkpointWithUndelivered();
    // A dead execution also left an earlier replacement's ledger and tokens: they must go.
    writeFileSync(ledgerPath(captureDir, 'r-a2'), `${JSON.stringify({ model_call_id: 'dead', staging_key: 'r-a2/dead' })}\n`);
    const fresh = await startModel(backend, { captureDir });
    const r = await control(fresh, 'restore', { checkpoint_id: 'rs1', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ phase: 'restored', source_checkpoint_id: 'c1', restored: ['r-a1'] });
    // Imported rows are live at once; their files (and the retired attempt's deletion) follow.
    expect(fresh.participant.ledger.rows('r-a1')).toEqual([{ ...saved, capture_key: 'r' }]);
    await fresh.participant.settled();
    expect(ledgerRows(fresh, 'r-a1')).toEqual([{ ...saved, capture_key: 'r' }]);
    expect(existsSync(ledgerPath(captureDir, 'r'))).toBe(false);
    expect(existsSync(ledgerPath(captureDir, 'r-a2'))).toBe(false);
    // The saved call's tokens stay (the imported row names them).
    expect(await readStagedTokens(captureDir, saved.staging_key)).toBeDefined();
    expect((await status(fresh)).restored_pending).toEqual(['r-a1']);

    // Admission stays closed until resume: the replacement's call waits.
    const next = pending(chat(fresh, 'r-a1', m1));
    await waitFor('the replacement waits', () => fresh.participant.waiting === 1);
    await resume(fresh, 'rs1');
    await next.done;
    expect(next.reply!.status).toBe(200);
    const rows = ledgerRows(fresh, 'r-a1');
    expect(rows.map((x) => x.parent_call_id)).toEqual([null, saved.model_call_id]);
    expect(rows[1].capture_key).toBeUndefined();
    // The call undelivered at the checkpoint is in no lineage.
    const lostId = backend.calls()[1]!.model_call_id;
    expect(rows.map((x) => x.model_call_id)).not.toContain(lostId);
    expect((await status(fresh)).restored_pending).toEqual([]);
    // A stale call of the checkpointed attempt is refused.
    const stale = await chat(fresh, 'r', m1);
    expect(stale.status).toBe(409);
    expect(stale.body.error.code).toBe('stale_attempt');
  });

  it('writes the imported ledger files and sweeps the retired ones once the restore resumes, not beside it', async () => {
    const { dir, captureDir, backend, saved } = await checkpointWithUndelivered();
    const fresh = await startModel(backend, { captureDir });
    expect((await control(fresh, 'restore', { checkpoint_id: 'rs1', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] })).status).toBe(200);
    // Live in memory and durable in the import journal; the files wait while other participants restore.
    expect(fresh.participant.ledger.rows('r-a1')).toEqual([{ ...saved, capture_key: 'r' }]);
    await sleep(300);
    expect(existsSync(ledgerPath(captureDir, 'r-a1'))).toBe(false);
    expect(existsSync(ledgerPath(captureDir, 'r'))).toBe(true);
    await resume(fresh, 'rs1');
    await waitFor('the files written and swept after resume', () => existsSync(ledgerPath(captureDir, 'r-a1')) && !existsSync(ledgerPath(captureDir, 'r')));
    await fresh.participant.settled(); // the file exists from its first byte on: wait for the write to end
    expect(ledgerRows(fresh, 'r-a1')).toEqual([{ ...saved, capture_key: 'r' }]);
  });

  it('restoring the same checkpoint again after the replacement made calls drops what that run left', async () => {
    const { dir, captureDir, backend, saved, m1 } = await checkpointWithUndelivered();
    const run1 = await startModel(backend, { captureDir });
    expect((await control(run1, 'restore', { checkpoint_id: 'rs1', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] })).status).toBe(200);
    await resume(run1, 'rs1');
    const a = await chat(run1, 'r-a1', m1);
    expect(a.status).toBe(200);
    const deadRows = ledgerRows(run1, 'r-a1');
    expect(deadRows).toHaveLength(2);
    await stopModel(run1);

    const run2 = await startModel(backend, { captureDir });
    expect((await control(run2, 'restore', { checkpoint_id: 'rs2', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] })).status).toBe(200);
    await run2.participant.settled();
    expect(ledgerRows(run2, 'r-a1')).toEqual([{ ...saved, capture_key: 'r' }]);
    expect(await listStagingKeys(captureDir, 'r-a1')).toEqual([]);
    await resume(run2, 'rs2');
    const b = await chat(run2, 'r-a1', m1);
    expect(b.status).toBe(200);
    const rows = ledgerRows(run2, 'r-a1');
    expect(rows.map((x) => x.parent_call_id)).toEqual([null, saved.model_call_id]);
    expect(rows.map((x) => x.model_call_id)).not.toContain(deadRows[1].model_call_id);
  });

  it('a retired attempt: its waiting call gets stale_attempt, its ledgers and tokens go, nothing is served after forget', async () => {
    const { dir, captureDir, backend, saved, m1 } = await checkpointWithUndelivered();
    const fresh = await startModel(backend, { captureDir });
    expect((await control(fresh, 'restore', { checkpoint_id: 'rs1', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] })).status).toBe(200);
    const before = backend.calls().length;
    const waiting = pending(chat(fresh, 'r-a1', m1));
    await waitFor('the call waits for admission', () => fresh.participant.waiting === 1);
    expect((await control(fresh, 'retire', { checkpoint_id: 'rs1', deadline_ts: deadline(), episode_ids: [ep('r', 1)] })).status).toBe(200);
    await waiting.done;
    expect(waiting.reply!.status).toBe(409);
    expect(waiting.reply!.body.error.code).toBe('stale_attempt');
    expect(existsSync(ledgerPath(captureDir, 'r-a1'))).toBe(false);
    expect(await listStagingKeys(captureDir, 'r')).toEqual([]);
    expect(await readStagedTokens(captureDir, saved.staging_key)).toBeUndefined();
    const manifest = await http('GET', `${fresh.url}/training-token-capture/control/rollouts/r-a1/manifest`, undefined, AUTH);
    expect(manifest.status).toBe(410);
    expect(manifest.body.error.detail).toMatch(/is retired/);
    expect((await control(fresh, 'forget', { checkpoint_id: 'rs1', deadline_ts: deadline(), rollout_ids: ['r'] })).status).toBe(200);
    await resume(fresh, 'rs1');
    await sleep(50);
    expect(backend.calls().length).toBe(before);
    const s = await status(fresh);
    expect(s).toMatchObject({ retired_rollouts: 0, restored_pending: [], restored_generation_cuts: [] });
    expect(s.report.counts.inflight).toBe(0);
  });

  it('retire cancels an admitted call of the attempt (it answers stale_attempt) and waits for it to stop', async () => {
    const backend = await startBackend();
    const model = await startModel(backend);
    const first = await chat(model, 'q', weatherStart());
    backend.state.holds.place({ after_calls: 1 });
    const held = pending(chat(model, 'q', afterToolRound(weatherStart(), first.body)));
    await waitFor('held at the backend', () => backend.state.holds.waiting === 1);
    const r = await control(model, 'retire', { checkpoint_id: 'retire', deadline_ts: deadline(), episode_ids: [ep('q')] });
    expect(r.status).toBe(200);
    await held.done;
    expect(held.reply?.status ?? 'no reply').toBe(409);
    expect(held.reply!.body.error.code).toBe('stale_attempt');
    expect(model.participant.inflight).toBe(0);
    expect(existsSync(ledgerPath(model.captureDir, 'q'))).toBe(false);
    expect(await listStagingKeys(model.captureDir, 'q')).toEqual([]);
  });

  it('a commit that leaves out an unstarted restored attempt deletes its ledger', async () => {
    const { dir, captureDir, backend } = await checkpointWithUndelivered();
    const fresh = await startModel(backend, { captureDir });
    expect((await control(fresh, 'restore', { checkpoint_id: 'rs1', deadline_ts: deadline(), checkpoint_dir: dir, episode_ids: [ep('r')] })).status).toBe(200);
    await resume(fresh, 'rs1');
    await prepare(fresh, 'c2');
    // Scope keeps r-a1: it is exported again (unclaimed restored state).
    const keep = await commit(fresh, 'c2', tempDir('model-participant'), [ep('r', 1)]);
    expect(keep.body.episode_ids).toEqual(['r-a1']);
    await resume(fresh, 'c2');
    await prepare(fresh, 'c3');
    const drop = await commit(fresh, 'c3', tempDir('model-participant'), []);
    expect(drop.status).toBe(200);
    expect(drop.body).toMatchObject({ episode_ids: [], staging_keys: [], staging_keys_by_episode: {} });
    expect(existsSync(ledgerPath(captureDir, 'r-a1'))).toBe(false);
    expect((await status(fresh)).restored_pending).toEqual([]);
  });
});

describe('capture directory default', () => {
  it('is beside the launcher endpoints file, else under the temp dir', () => {
    const ctx = modelContext('http://127.0.0.1:1', { backend: 'policy_backend' });
    const opts = { backend: 'policy_backend', checkpoint_policy: true, checkpoint_generation_cuts: false };
    expect(captureDirOf(ctx, { ...opts, capture_dir: '/x/y' })).toBe('/x/y');
    expect(captureDirOf(ctx, opts, ['node', 'main.ts', '--endpoints', '/run/gym/endpoints.json'])).toBe(join('/run/gym', 'capture', 'policy_model'));
    expect(captureDirOf(ctx, opts, ['node'])).toMatch(/gym-capture[/\\]policy_model$/);
  });
});
