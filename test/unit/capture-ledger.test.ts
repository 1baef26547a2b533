// The capture ledger's files and index (servers/model/capture-ledger.ts) and the token store
// (servers/model/token-store.ts): append-only rows per capture key, import, deletes by attempt
// range that keep the staged tokens a restored row still names, and what a dead execution left.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { readdirSync } from 'node:fs';
import { CaptureLedger, JOURNAL_SUFFIX, ledgerPath, type LedgerRow } from '../../servers/model/capture-ledger.js';
import {
  deleteStagedTokens,
  listStagingKeys,
  parseStagingKey,
  readLedgerRows,
  readStagedTokens,
  stagedTokensPath,
  stagingKeyOf,
  TOKEN_STORE_FORMAT,
  writeStagedTokens,
  type StagedTokens,
} from '../../servers/model/token-store.js';
import { tempDir } from '../helpers/temp-dir.js';

const row = (id: string, key: string, extra: Partial<LedgerRow> = {}): LedgerRow => ({
  model_call_id: id,
  staging_key: stagingKeyOf(key, id),
  parent_call_id: null,
  ...extra,
});

function staged(key: string, id: string): StagedTokens {
  return {
    format: TOKEN_STORE_FORMAT,
    staging_key: stagingKeyOf(key, id),
    capture_key: key,
    model_call_id: id,
    weight_version: 3,
    prompt_token_ids: [1, 2, 3],
    completion_token_ids: [4, 5],
    completion_logprobs: [-0.5, 0],
    finish_reason: 'stop',
    complete: true,
  };
}

const fileRows = (dir: string, key: string): unknown[] =>
  readFileSync(ledgerPath(dir, key), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

describe('token store', () => {
  it('maps staging keys to files and reads back what was written', async () => {
    const dir = tempDir('capture-ledger');
    expect(parseStagingKey('wx-17/mc_1')).toEqual({ captureKey: 'wx-17', modelCallId: 'mc_1' });
    expect(parseStagingKey('__generation_cut__/wx-17/mc_1')).toBeUndefined();
    expect(parseStagingKey('../x')).toBeUndefined();
    expect(() => stagedTokensPath(dir, 'a/../../b')).toThrow(/not a staging key/);
    await writeStagedTokens(dir, staged('wx-17-a1', 'mc_1'));
    await writeStagedTokens(dir, staged('wx-17-a1', 'mc_2'));
    expect(stagedTokensPath(dir, 'wx-17-a1/mc_1')).toBe(join(dir, 'tokens', 'wx-17-a1', 'mc_1.json'));
    expect(await readStagedTokens(dir, 'wx-17-a1/mc_1')).toEqual(staged('wx-17-a1', 'mc_1'));
    expect(await readStagedTokens(dir, 'wx-17-a1/nope')).toBeUndefined();
    expect(await listStagingKeys(dir, 'wx-17-a1')).toEqual(['wx-17-a1/mc_1', 'wx-17-a1/mc_2']);
    expect(await deleteStagedTokens(dir, 'wx-17-a1', new Set(['wx-17-a1/mc_2']))).toBe(1);
    expect(await listStagingKeys(dir, 'wx-17-a1')).toEqual(['wx-17-a1/mc_2']);
    expect(await deleteStagedTokens(dir, 'wx-17-a1')).toBe(1);
    expect(existsSync(join(dir, 'tokens', 'wx-17-a1'))).toBe(false);
    expect(await deleteStagedTokens(dir, 'never')).toBe(0);
  });
});

describe('capture ledger', () => {
  it('appends JSON lines per capture key and keeps them in memory', async () => {
    const dir = tempDir('capture-ledger');
    const ledger = await CaptureLedger.open(dir);
    await ledger.append('r1', row('c1', 'r1'));
    await Promise.all([ledger.append('r1', row('c2', 'r1', { parent_call_id: 'c1' })), ledger.append('r2', row('d1', 'r2'))]);
    expect(ledger.rows('r1').map((r) => r.model_call_id)).toEqual(['c1', 'c2']);
    expect(fileRows(dir, 'r1')).toEqual([row('c1', 'r1'), row('c2', 'r1', { parent_call_id: 'c1' })]);
    expect(ledger.rows('nope')).toEqual([]);
    expect([...ledger.keys()].sort()).toEqual(['r1', 'r2']);
    // The trainer's reader sees the same rows.
    expect(await readLedgerRows(dir, 'r1')).toEqual([row('c1', 'r1'), row('c2', 'r1', { parent_call_id: 'c1' })]);
    expect(await readLedgerRows(dir, 'none')).toEqual([]);
  });

  it('the first row of a key replaces a file a dead execution left; open indexes leftovers', async () => {
    const dir = tempDir('capture-ledger');
    mkdirSync(join(dir, 'ledger'), { recursive: true });
    writeFileSync(ledgerPath(dir, 'r1'), `${JSON.stringify(row('dead', 'r1'))}\n`);
    writeFileSync(ledgerPath(dir, 'r9-a2'), `${JSON.stringify(row('dead', 'r9-a2'))}\n`);
    await writeStagedTokens(dir, staged('r9-a2', 'dead'));
    const ledger = await CaptureLedger.open(dir);
    expect(ledger.keysOf('r9').sort()).toEqual(['r9-a2']);
    expect(ledger.rows('r1')).toEqual([]); // a fresh process does not adopt a dead one's rows
    await ledger.append('r1', row('c1', 'r1'));
    expect(fileRows(dir, 'r1')).toEqual([row('c1', 'r1')]);
  });

  it('replace imports rows; deleteAttempts drops ledgers and tokens of a range but keeps tokens restored rows name', async () => {
    const dir = tempDir('capture-ledger');
    // A dead execution of attempt 0 staged c1 (checkpointed) and c2 (after the checkpoint).
    mkdirSync(join(dir, 'ledger'), { recursive: true });
    writeFileSync(ledgerPath(dir, 'r'), `${JSON.stringify(row('c1', 'r'))}\n${JSON.stringify(row('c2', 'r'))}\n`);
    await writeStagedTokens(dir, staged('r', 'c1'));
    await writeStagedTokens(dir, staged('r', 'c2'));
    // …and a dead replacement r-a1 from an earlier restore of the same checkpoint.
    writeFileSync(ledgerPath(dir, 'r-a1'), `${JSON.stringify(row('x1', 'r-a1'))}\n`);
    await writeStagedTokens(dir, staged('r-a1', 'x1'));
    const ledger = await CaptureLedger.open(dir);

    await ledger.deleteAttempts('r', 1, Number.MAX_SAFE_INTEGER);
    expect(existsSync(ledgerPath(dir, 'r-a1'))).toBe(false);
    expect(await listStagingKeys(dir, 'r-a1')).toEqual([]);

    await ledger.replace('r-a1', [{ ...row('c1', 'r'), capture_key: 'r' }]);
    expect(fileRows(dir, 'r-a1')).toEqual([{ ...row('c1', 'r'), capture_key: 'r' }]);

    await ledger.deleteAttempts('r', 0, 0);
    expect(existsSync(ledgerPath(dir, 'r'))).toBe(false);
    // c1 is named by the imported row: kept. c2 is not: gone.
    expect(await listStagingKeys(dir, 'r')).toEqual(['r/c1']);

    // Retiring the replacement too leaves nothing of the rollout.
    await ledger.deleteAttempts('r', 0, 1);
    expect(ledger.rows('r-a1')).toEqual([]);
    expect(existsSync(ledgerPath(dir, 'r-a1'))).toBe(false);
    expect(await listStagingKeys(dir, 'r')).toEqual([]);
    expect(ledger.keysOf('r')).toEqual([]);
  });

  it('deleteLedger leaves the token store alone', async () => {
    const dir = tempDir('capture-ledger');
    const ledger = await CaptureLedger.open(dir);
    await writeStagedTokens(dir, staged('q', 'c1'));
    ledger.noteTokens('q');
    await ledger.append('q', row('c1', 'q'));
    await ledger.deleteLedger('q');
    expect(existsSync(ledgerPath(dir, 'q'))).toBe(false);
    expect(await listStagingKeys(dir, 'q')).toEqual(['q/c1']);
  });

  it('importEpisodes: rows live at once, journaled, files written in the background ahead of appends; a crash journal is replayed', async () => {
    const dir = tempDir('capture-ledger');
    mkdirSync(join(dir, 'ledger'), { recursive: true });
    // Left by dead executions: attempt 0 (checkpointed) and an earlier replacement r-a1.
    writeFileSync(ledgerPath(dir, 'r'), `${JSON.stringify(row('c1', 'r'))}\n`);
    writeFileSync(ledgerPath(dir, 'r-a1'), `${JSON.stringify(row('x1', 'r-a1'))}\n`);
    await writeStagedTokens(dir, staged('r', 'c1'));
    await writeStagedTokens(dir, staged('r', 'c2'));
    await writeStagedTokens(dir, staged('r-a1', 'x1'));
    const ledger = await CaptureLedger.open(dir);
    const imported = [{ ...row('c1', 'r'), capture_key: 'r' }];
    const { retired, materialized } = await ledger.importEpisodes([
      { rolloutId: 'r', targetKey: 'r-a1', rows: imported, retireUpTo: 0 },
      { rolloutId: 's', targetKey: 's-a1', rows: undefined, retireUpTo: 0 },
    ]);
    expect(retired).toEqual(['r']);
    expect(ledger.rows('r-a1')).toEqual(imported);
    expect(ledger.rows('r')).toEqual([]);
    // The dead replacement's tokens went before the import.
    expect(await listStagingKeys(dir, 'r-a1')).toEqual([]);
    // An append right away still lands after the imported row.
    await ledger.append('r-a1', row('n1', 'r-a1', { parent_call_id: 'c1' }));
    await materialized;
    expect(fileRows(dir, 'r-a1')).toEqual([...imported, row('n1', 'r-a1', { parent_call_id: 'c1' })]);
    expect(readdirSync(join(dir, 'ledger')).filter((n) => n.endsWith(JOURNAL_SUFFIX))).toEqual([]);
    await ledger.sweepRetired('r');
    expect(existsSync(ledgerPath(dir, 'r'))).toBe(false);
    expect(await listStagingKeys(dir, 'r')).toEqual(['r/c1']);

    // A journal a crashed process left: missing ledgers are written, existing ones kept.
    const journal = join(dir, 'ledger', `import-1-1-1${JOURNAL_SUFFIX}`);
    writeFileSync(
      journal,
      `${JSON.stringify({ capture_key: 'q-a1', rows: [row('c9', 'q')] })}\n${JSON.stringify({ capture_key: 'r-a1', rows: imported })}\n{"torn`,
    );
    const reopened = await CaptureLedger.open(dir);
    expect(fileRows(dir, 'q-a1')).toEqual([row('c9', 'q')]);
    expect(fileRows(dir, 'r-a1')).toHaveLength(2);
    expect(existsSync(journal)).toBe(false);
    expect(reopened.keysOf('q')).toEqual(['q-a1']);
  });
});

describe('descriptors under a burst of calls', () => {
  // A model answering thousands of calls at once writes a ledger row and a token file for each.
  // Unbounded, every pending write held an open descriptor: beside the calls' sockets, a model
  // process ran out (`EMFILE`) and withheld the replies it could not record.
  const fdDir = '/proc/self/fd';
  it.skipIf(!existsSync(fdDir))('keeps the open descriptors bounded while 3,000 rows and token files are written at once', async () => {
    const ledger = await CaptureLedger.open(tempDir('capture-ledger'));
    const baseline = readdirSync(fdDir).length;
    let peak = baseline;
    const sampler = setInterval(() => (peak = Math.max(peak, readdirSync(fdDir).length)), 1);
    try {
      const keys = Array.from({ length: 3000 }, (_, i) => `burst-${i}`);
      await Promise.all(keys.flatMap((k) => [ledger.append(k, row('c1', k)), writeStagedTokens(ledger.captureDir, staged(k, 'c1'))]));
      peak = Math.max(peak, readdirSync(fdDir).length);
      expect(ledger.rows('burst-2999')).toHaveLength(1);
      expect(await readStagedTokens(ledger.captureDir, stagingKeyOf('burst-2999', 'c1'))).toBeDefined();
    } finally {
      clearInterval(sampler);
    }
    expect(peak - baseline).toBeLessThan(300);
  });
});
