// The capture ledger (participants.md §5.4): per capture key, append-only JSON Lines of token-free
// rows (`<capture_dir>/ledger/<capture key>.lineage.jsonl`), one row per delivered model call,
// naming its `model_call_id`, `parent_call_id` and `staging_key` in the token store
// (token-store.ts). This process keeps the rows it wrote or imported in memory (parent
// resolution, export); the files are what outlives it. An index of every capture key that has a
// ledger file or a token-store directory on disk — including what a dead execution left — lets
// restore and retire delete by rollout without listing directories again.
//
// Not fsynced: the crash this protects against is a killed process, and the page cache survives it.
import { existsSync, unlink, writeFile as writeFileRaw } from 'node:fs';
import { appendFile, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parseCaptureKey, type CaptureKey } from '../../protocol/ids.js';
import { Slots } from '../common/async.js';
import { callFileSlots } from './file-slots.js';
import { resolveParent, type RequestContext } from './conversation.js';
import { deleteStagedTokens, LEDGER_DIR, LEDGER_SUFFIX, ledgerPath, TOKENS_DIR } from './token-store.js';

export { LEDGER_DIR, LEDGER_SUFFIX, ledgerPath };
/** A restore's imported rows until their ledger files exist (importEpisodes). */
export const JOURNAL_SUFFIX = '.import.jsonl';
/** Concurrent file operations of one bulk import or sweep. */
const IO_CONCURRENCY = 32;

export interface ImportEntry {
  rolloutId: string;
  /** The replacement attempt's capture key (N+1). */
  targetKey: CaptureKey;
  /** Rows to import under it (undefined: an in-scope episode without a record here). */
  rows: readonly LedgerRow[] | undefined;
  /** The checkpointed attempt N: its ledger and earlier ones are retired. */
  retireUpTo: number;
}

export interface ImportResult {
  /** Retired capture keys whose files `sweepRetired` deletes. */
  retired: CaptureKey[];
  /** Settles once every imported ledger file is written. */
  materialized: Promise<void>;
}

/** A ledger row: opaque JSON with a few fields this server reads (§5.3, §5.4). */
export interface LedgerRow {
  model_call_id: string;
  staging_key?: string;
  parent_call_id?: string | null;
  /** Set on restored rows: the capture key the row was staged under. */
  capture_key?: string;
  [field: string]: unknown;
}

const attemptOf = (key: CaptureKey): number => parseCaptureKey(key)?.attempt ?? 0;

function addTo(index: Map<string, Set<CaptureKey>>, key: CaptureKey): void {
  const e = parseCaptureKey(key);
  if (!e) return;
  let set = index.get(e.rollout_id);
  if (!set) index.set(e.rollout_id, (set = new Set()));
  set.add(key);
}

function removeFrom(index: Map<string, Set<CaptureKey>>, key: CaptureKey): void {
  const e = parseCaptureKey(key);
  if (!e) return;
  const set = index.get(e.rollout_id);
  set?.delete(key);
  if (set && set.size === 0) index.delete(e.rollout_id);
}

function unlinkQuiet(file: string): Promise<void> {
  return new Promise((resolve, reject) => unlink(file, (err) => (err && err.code !== 'ENOENT' ? reject(err) : resolve())));
}

function writeFileCb(file: string, data: string): Promise<void> {
  return new Promise((resolve, reject) => writeFileRaw(file, data, (err) => (err ? reject(err) : resolve())));
}

async function forEachLimit<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

export class CaptureLedger {
  private readonly rowsByKey = new Map<CaptureKey, LedgerRow[]>();
  /** Rollout → capture keys with a ledger file. */
  private readonly ledgerKeys = new Map<string, Set<CaptureKey>>();
  /** Rollout → capture keys with a token-store directory. */
  private readonly tokenKeys = new Map<string, Set<CaptureKey>>();
  /** Writes of one key run in order (an append never overtakes an import or a delete). */
  private readonly chains = new Map<CaptureKey, Promise<unknown>>();

  private imports = 0;

  private constructor(readonly captureDir: string) {}

  /** Creates the directories and indexes what is already on disk. */
  static async open(captureDir: string): Promise<CaptureLedger> {
    const ledger = new CaptureLedger(captureDir);
    await mkdir(join(captureDir, LEDGER_DIR), { recursive: true });
    await mkdir(join(captureDir, TOKENS_DIR), { recursive: true });
    const journals: string[] = [];
    for (const name of await readdir(join(captureDir, LEDGER_DIR))) {
      if (name.endsWith(LEDGER_SUFFIX)) addTo(ledger.ledgerKeys, name.slice(0, -LEDGER_SUFFIX.length));
      else if (name.endsWith(JOURNAL_SUFFIX)) journals.push(join(captureDir, LEDGER_DIR, name));
    }
    for (const j of journals.sort()) await ledger.replayJournal(j);
    for (const name of await readdir(join(captureDir, TOKENS_DIR))) addTo(ledger.tokenKeys, name);
    return ledger;
  }

  /**
   * An import journal a dead process left: writes the ledgers it had not written yet (a ledger
   * file that exists was written, and maybe appended to, since), then drops the journal.
   */
  private async replayJournal(file: string): Promise<void> {
    const lines = (await readFile(file, 'utf8')).split('\n');
    await forEachLimit(lines, IO_CONCURRENCY, async (line) => {
      let entry: { capture_key?: unknown; rows?: unknown };
      try {
        entry = JSON.parse(line) as typeof entry;
      } catch {
        return; // blank, or the torn last line of a crashed write
      }
      const key = entry.capture_key;
      if (typeof key !== 'string' || !parseCaptureKey(key) || !Array.isArray(entry.rows)) return;
      const path = ledgerPath(this.captureDir, key);
      if (!existsSync(path)) await writeFile(path, entry.rows.map((r) => `${JSON.stringify(r)}\n`).join(''));
      addTo(this.ledgerKeys, key);
    });
    await unlinkQuiet(file);
  }

  /** Rows this process wrote or imported for `key` (empty for a key it never saw). */
  rows(key: CaptureKey): readonly LedgerRow[] {
    return this.rowsByKey.get(key) ?? [];
  }

  /** Capture keys this process holds rows for. */
  keys(): IterableIterator<CaptureKey> {
    return this.rowsByKey.keys();
  }

  parentOf(key: CaptureKey, ctx: RequestContext): string | null {
    const rows = this.rowsByKey.get(key);
    return rows ? resolveParent(rows, ctx) : null;
  }

  /** The token store now has a directory for `key` (written by the participant). */
  noteTokens(key: CaptureKey): void {
    addTo(this.tokenKeys, key);
  }

  private chain<T>(key: CaptureKey, work: () => Promise<T>): Promise<T> {
    const prev = this.chains.get(key) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(work);
    this.chains.set(key, next);
    const clear = (): void => {
      if (this.chains.get(key) === next) this.chains.delete(key);
    };
    next.then(clear, clear);
    return next;
  }

  /**
   * Appends one row (file first, then memory). The first row this process writes for a key it
   * did not import replaces whatever file a dead execution left under that key.
   */
  append(key: CaptureKey, row: LedgerRow): Promise<void> {
    return this.chain(key, async () => {
      const known = this.rowsByKey.get(key);
      const line = `${JSON.stringify(row)}\n`;
      const file = ledgerPath(this.captureDir, key);
      await callFileSlots.run(() => (known ? appendFile(file, line) : writeFile(file, line)));
      addTo(this.ledgerKeys, key);
      if (known) known.push(row);
      else this.rowsByKey.set(key, [row]);
    });
  }

  /** Replaces the ledger of `key` with `rows` (restore's import). */
  replace(key: CaptureKey, rows: readonly LedgerRow[]): Promise<void> {
    return this.chain(key, async () => {
      const text = rows.map((r) => `${JSON.stringify(r)}\n`).join('');
      await callFileSlots.run(() => writeFile(ledgerPath(this.captureDir, key), text));
      addTo(this.ledgerKeys, key);
      this.rowsByKey.set(key, [...rows]);
    });
  }

  /** Deletes the ledger of `key` (rows and file); the token store is left alone. */
  deleteLedger(key: CaptureKey): Promise<void> {
    return this.chain(key, async () => {
      this.rowsByKey.delete(key);
      await rm(ledgerPath(this.captureDir, key), { force: true });
      removeFrom(this.ledgerKeys, key);
    });
  }

  /** Whether the token store has a directory for `key` (written here or left by a dead execution). */
  hasTokens(key: CaptureKey): boolean {
    const e = parseCaptureKey(key);
    return e !== undefined && (this.tokenKeys.get(e.rollout_id)?.has(key) ?? false);
  }

  /** Every capture key of a rollout with a ledger (file or rows) or token-store directory. */
  keysOf(rolloutId: string): CaptureKey[] {
    const out = new Set<CaptureKey>([...(this.ledgerKeys.get(rolloutId) ?? []), ...(this.tokenKeys.get(rolloutId) ?? [])]);
    return [...out];
  }

  /** Staging keys the rows of `keys` refer to. */
  stagingKeysOf(keys: Iterable<CaptureKey>): Set<string> {
    const out = new Set<string>();
    for (const k of keys) for (const r of this.rowsByKey.get(k) ?? []) if (typeof r.staging_key === 'string') out.add(r.staging_key);
    return out;
  }

  /**
   * Restore's import (participants.md §5.3), for many episodes at once (a process being restored
   * has no writes in flight). Per entry: deletes everything of the rollout's attempts ≥ the
   * target's (what dead executions left: an earlier restore of the same checkpoint), imports the
   * rows under `targetKey`, and retires the ledgers of attempts ≤ `retireUpTo` (their rows are
   * dropped at once; their files go in `sweepRetired`, after the reply: no call of a retired
   * attempt can write any more).
   *
   * The imported rows are live in memory at once and durable in one journal file when this
   * returns; the per-key ledger files are written in the background (`materialized`), once
   * `writeAfter` settles, each ahead of any append to its key. Creating thousands of small files
   * is what makes an import slow, so it is kept off the restore's critical path; a journal left by
   * a crash is replayed by `open`.
   */
  async importEpisodes(entries: readonly ImportEntry[], writeAfter: Promise<void> = Promise.resolve()): Promise<ImportResult> {
    const leftovers: Array<() => Promise<void>> = [];
    for (const e of entries) {
      const targetAttempt = attemptOf(e.targetKey);
      for (const key of this.keysOf(e.rolloutId)) {
        if (attemptOf(key) < targetAttempt) continue;
        this.assertNoWrites(key);
        this.rowsByKey.delete(key);
        if (this.ledgerKeys.get(e.rolloutId)?.has(key)) {
          removeFrom(this.ledgerKeys, key);
          leftovers.push(() => unlinkQuiet(ledgerPath(this.captureDir, key)));
        }
        if (this.hasTokens(key)) {
          removeFrom(this.tokenKeys, key);
          leftovers.push(() => rm(join(this.captureDir, TOKENS_DIR, key), { recursive: true, force: true }));
        }
      }
    }
    await forEachLimit(leftovers, IO_CONCURRENCY, (op) => op());

    const retired: CaptureKey[] = [];
    const imported: Array<{ key: CaptureKey; rows: readonly LedgerRow[] }> = [];
    const journal: string[] = [];
    for (const e of entries) {
      for (const key of this.keysOf(e.rolloutId)) {
        if (attemptOf(key) > e.retireUpTo) continue;
        this.rowsByKey.delete(key);
        retired.push(key);
      }
      if (!e.rows) continue;
      this.assertNoWrites(e.targetKey);
      this.rowsByKey.set(e.targetKey, [...e.rows]);
      addTo(this.ledgerKeys, e.targetKey);
      imported.push({ key: e.targetKey, rows: e.rows });
      journal.push(JSON.stringify({ capture_key: e.targetKey, rows: e.rows }));
    }
    if (imported.length === 0) return { retired, materialized: Promise.resolve() };

    const journalFile = join(this.captureDir, LEDGER_DIR, `import-${Date.now()}-${process.pid}-${++this.imports}${JOURNAL_SUFFIX}`);
    await writeFile(journalFile, `${journal.join('\n')}\n`);
    const io = new Slots(IO_CONCURRENCY);
    // Chained per key now, so an append can never overtake its key's import.
    const writes = imported.map(({ key, rows }) =>
      this.chain(key, () =>
        writeAfter.then(() => io.run(() => writeFileCb(ledgerPath(this.captureDir, key), rows.map((r) => `${JSON.stringify(r)}\n`).join('')))),
      ),
    );
    const materialized = Promise.all(writes).then(() => unlinkQuiet(journalFile));
    materialized.catch(() => undefined);
    return { retired, materialized };
  }

  private assertNoWrites(key: CaptureKey): void {
    if (this.chains.has(key)) throw new Error(`capture ledger ${key} has writes in flight; it cannot be replaced now`);
  }

  /**
   * Deletes the ledger file of a retired capture key and its staged tokens that no ledger of its
   * rollout names any more (a restored row keeps the staging key it was staged under).
   */
  async sweepRetired(key: CaptureKey): Promise<void> {
    const e = parseCaptureKey(key);
    if (!e) return;
    if (!this.rowsByKey.has(key) && this.ledgerKeys.get(e.rollout_id)?.has(key)) {
      removeFrom(this.ledgerKeys, key);
      await unlinkQuiet(ledgerPath(this.captureDir, key));
    }
    if (!this.hasTokens(key)) return;
    const keep = new Set([...this.stagingKeysOf(this.ledgerKeys.get(e.rollout_id) ?? [])].filter((s) => s.startsWith(`${key}/`)));
    await deleteStagedTokens(this.captureDir, key, keep);
    if (keep.size === 0) removeFrom(this.tokenKeys, key);
  }

  /**
   * Deletes ledgers and staged tokens of the rollout's attempts in [from, to]. Staged tokens that
   * a ledger of the rollout outside that range still refers to are kept (a restored row keeps the
   * staging key of the attempt it was staged under).
   */
  async deleteAttempts(rolloutId: string, from: number, to: number): Promise<void> {
    const keys = this.keysOf(rolloutId);
    const inRange = keys.filter((k) => attemptOf(k) >= from && attemptOf(k) <= to);
    if (inRange.length === 0) return;
    const outside = [...(this.ledgerKeys.get(rolloutId) ?? [])].filter((k) => !inRange.includes(k));
    const keep = this.stagingKeysOf(outside);
    for (const key of inRange) {
      await this.deleteLedger(key);
      if (this.tokenKeys.get(rolloutId)?.has(key)) {
        const keepHere = new Set([...keep].filter((s) => s.startsWith(`${key}/`)));
        await deleteStagedTokens(this.captureDir, key, keepHere);
        if (keepHere.size === 0) removeFrom(this.tokenKeys, key);
      }
    }
  }
}
