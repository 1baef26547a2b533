// Commit/restore throughput of manifest-last storage (control-plane.md §9).
//
//   npx tsx bench/storage.ts [--sessions 1000] [--session-kb 350] [--small 16000] [--repeat 3]
//                            [--non-ascii-rate 0.002]   (fraction of words that are non-ASCII)
//                            [--ledger 16000]           (model-ledger import of N episodes; 0 skips)
//
// Case "sessions": N resources session states of ~KB each (a conversation: messages with text
// that has newlines, quotes, tabs and occasional non-ASCII, float logprobs, token counts,
// nested metadata).
// Case "small": M small environment records (task digest + boundary). Each case is committed
// with `writeRecords` into a fresh temp dir and restored with `readRecords` (scope = every
// key); the median of --repeat runs is reported. Sessions restore as a resources participant
// whose hooks take deferred states does (`defer: 'state'`: every line parsed and checked on the
// records workers, the states built on first use); the eager read of the same file and the cost
// of materializing every state afterwards are printed beside it. "model ledger import": the
// policy model's restore of N episodes (bench/lib/model-participant.ts), NeMo Gym's 1.5 s case. Restore reads a file the commit just wrote, so
// it is served from the page cache (a restore after a host restart also pays the disk read).
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { captureKey } from '../protocol/ids.js';
import { materialized } from '../protocol/deferred-json.js';
import { readRecords } from '../servers/control/storage/reader.js';
import { writeRecords } from '../servers/control/storage/writer.js';
import { importCase, removeTempDirs } from './lib/model-participant.js';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const v = Number(process.argv[i + 1]);
  if (!Number.isFinite(v) || v < 0) throw new Error(`--${name} needs a non-negative number`);
  return v;
}

const SESSIONS = arg('sessions', 1000);
const SESSION_KB = arg('session-kb', 350);
const SMALL = arg('small', 16000);
const REPEAT = Math.max(1, Math.floor(arg('repeat', 3)));
const LEDGER = Math.floor(arg('ledger', 16000));

// --- deterministic synthetic data -------------------------------------------------------------

let seed = 12345;
function rnd(): number {
  seed = (Math.imul(seed, 1103515245) + 12345) & 0x7fffffff;
  return seed / 0x7fffffff;
}
const WORDS = (
  'the of and to in is that for it as was with be by on not this are or from at which but have an they ' +
  'you were there would their we been has when who will more if out so said what up its about than into ' +
  'them can only other new some could time these two may first then do any like now over such our even ' +
  'most made after also did many before must through back years where much your way well down should ' +
  'because each just those people how too little state good very make world still own see work long get ' +
  'here between both life being under never day same another know while last might great old year off ' +
  'come since against go came right used take three function return const value error file path'
).split(' ');
/** English agent transcripts are mostly ASCII with an occasional typographic or foreign character. */
const RARE = ['—', '’', 'café', 'naïve', '→', '東京', '✓', 'Ω'];
const RARE_RATE = arg('non-ascii-rate', 0.002);

function text(chars: number): string {
  let s = '';
  while (s.length < chars) {
    s += rnd() < RARE_RATE ? RARE[(rnd() * RARE.length) | 0] : WORDS[(rnd() * WORDS.length) | 0];
    const r = rnd();
    s += r < 0.04 ? '\n' : r < 0.07 ? '. ' : r < 0.075 ? ' "quoted" ' : r < 0.078 ? '\t' : ' ';
  }
  return s;
}

/** A pool of distinct message texts; sessions draw from it so building 350 MB stays quick. */
const POOL = Array.from({ length: 4096 }, () => text(200 + ((rnd() * 3600) | 0)));

function sessionRecord(i: number, kb: number): object {
  const messages: object[] = [];
  let size = 0;
  for (let t = 0; size < kb * 1024; t++) {
    const content = POOL[(rnd() * POOL.length) | 0]!;
    const tokens = 1 + ((content.length / 4) | 0);
    messages.push({
      role: t % 2 ? 'assistant' : 'user',
      content,
      tokens,
      logprob: t % 2 ? -rnd() * 3 : null,
      meta: { turn: t, latency_s: Math.round(rnd() * 5000) / 1000, tool: t % 5 === 3 ? 'search' : null },
    });
    size += content.length + 120;
  }
  return {
    episode_id: { rollout_id: `task${i}-roll0`, attempt: 1 },
    session_id: `sess-${i.toString(16).padStart(8, '0')}`,
    state: {
      messages,
      step: messages.length,
      reward: 0.5,
      budget: { max_turns: 64, used_turns: messages.length, temperature: 0.7 },
      created_ts: 1767225600.25 + i,
    },
    owner: null,
  };
}

function smallRecord(i: number): object {
  return {
    episode_id: { rollout_id: `task${i}-roll${i % 8}`, attempt: i % 3 },
    task_digest: ((i * 2654435761) >>> 0).toString(16).padStart(8, '0').repeat(8),
    boundary: {
      next: i % 2 ? 'verify' : 'step',
      seeded: true,
      step: i % 17,
      observation: text(300),
      scores: [rnd(), rnd(), rnd()],
    },
  };
}

// --- measurement ------------------------------------------------------------------------------

interface Measured {
  commit_s: number;
  /** The restore as the participant does it (with `defer`: the lines checked on the records workers). */
  restore_s: number;
  /** The same file read eagerly: every record parsed into objects before the read returns. */
  restore_eager_s: number;
  /** Parsing every deferred value afterwards (what first use costs, summed), main thread. */
  materialize_s: number;
  /** CPU seconds of the whole process (all threads) during each phase: less sensitive to a busy machine. */
  commit_cpu_s: number;
  restore_cpu_s: number;
  bytes: number;
}

function cpuSeconds(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

async function timedRead(dir: string, kind: string, scope: ReadonlySet<string>, defer: string | undefined, expected: number) {
  (globalThis as { gc?: () => void }).gc?.();
  const c0 = cpuSeconds();
  const t0 = performance.now();
  const read = await readRecords({ checkpointDir: dir, kind, instance: 'bench', scope, defer });
  const seconds = (performance.now() - t0) / 1000;
  const cpu = cpuSeconds() - c0;
  if (read.records.length !== expected) throw new Error(`count mismatch: read ${read.records.length}, expected ${expected}`);
  return { read, seconds, cpu };
}

/** `defer`: the field the participant kind defers (resources: `state`), or none. */
async function measure(records: object[], kind: 'resources' | 'environment', defer: string | undefined): Promise<Measured> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-storage-'));
  try {
    const c0 = cpuSeconds();
    const t0 = performance.now();
    const manifest = await writeRecords({ checkpointDir: dir, kind, instance: 'bench', checkpointId: 'bench-1', records });
    const t1 = performance.now();
    const c1 = cpuSeconds();
    if (manifest.record_count !== records.length) throw new Error(`wrote ${manifest.record_count} of ${records.length}`);
    const scope = new Set(records.map((r) => captureKey((r as { episode_id: { rollout_id: string; attempt: number } }).episode_id)));
    // The participant's read first (on a heap the eager read has not filled), then the eager one.
    const main = await timedRead(dir, kind, scope, defer, records.length);
    const t2 = performance.now();
    for (const r of main.read.records) materialized((r as Record<string, unknown>)[defer ?? '']);
    const materialize_s = defer === undefined ? 0 : (performance.now() - t2) / 1000;
    main.read.records.length = 0;
    const eager = defer === undefined ? main : await timedRead(dir, kind, scope, undefined, records.length);
    eager.read.records.length = 0;
    const { size } = statSync(path.join(dir, 'gym', kind, 'bench', manifest.records_file));
    return {
      commit_s: (t1 - t0) / 1000,
      restore_s: main.seconds,
      restore_eager_s: eager.seconds,
      materialize_s,
      commit_cpu_s: c1 - c0,
      restore_cpu_s: main.cpu,
      bytes: size,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[(s.length - 1) >> 1]!;
}

async function runCase(
  name: string,
  records: object[],
  kind: 'resources' | 'environment',
  defer: string | undefined,
): Promise<Row & { commit_s: number; restore_s: number }> {
  const runs: Measured[] = [];
  for (let r = 0; r < REPEAT; r++) {
    (globalThis as { gc?: () => void }).gc?.();
    runs.push(await measure(records, kind, defer));
  }
  const med = (k: keyof Measured) => median(runs.map((m) => m[k]));
  const commit = med('commit_s');
  const restore = med('restore_s');
  return {
    case: name,
    records: records.length,
    MB: Math.round((runs[0]!.bytes / 1e6) * 10) / 10,
    'commit s': round3(commit),
    'restore s': round3(restore),
    restore: defer === undefined ? 'eager' : `${defer} deferred`,
    'eager restore s': round3(med('restore_eager_s')),
    'materialize s': defer === undefined ? '-' : round3(med('materialize_s')),
    'commit MB/s': Math.round(runs[0]!.bytes / 1e6 / commit),
    'restore MB/s': Math.round(runs[0]!.bytes / 1e6 / restore),
    'commit cpu s': round3(med('commit_cpu_s')),
    'restore cpu s': round3(med('restore_cpu_s')),
    runs: REPEAT,
    commit_s: commit,
    restore_s: restore,
  };
}

async function main(): Promise<void> {
  const sessions = Array.from({ length: SESSIONS }, (_, i) => sessionRecord(i, SESSION_KB));
  const small = Array.from({ length: SMALL }, (_, i) => smallRecord(i));

  // Warm-up (JIT, allocator) on a slice of each case; not reported.
  await measure(sessions.slice(0, Math.min(40, sessions.length)), 'resources', 'state');
  await measure(small.slice(0, Math.min(2000, small.length)), 'environment', undefined);

  const rows: (Row & { commit_s: number; restore_s: number })[] = [];
  // Resources participants whose session hooks take deferred states restore this way (the counter does).
  if (SESSIONS > 0) rows.push(await runCase(`sessions ${SESSION_KB} KB`, sessions, 'resources', 'state'));
  if (SMALL > 0) rows.push(await runCase('small', small, 'environment', undefined));
  let ledgerImport: number | null = null;
  if (LEDGER > 0) {
    const [{ import_s }] = [await importCase(LEDGER)];
    removeTempDirs();
    ledgerImport = import_s!;
    rows.push({
      case: 'model ledger import',
      records: LEDGER,
      MB: '-',
      'commit s': '-',
      'restore s': round3(ledgerImport),
      restore: 'eager',
      'eager restore s': '-',
      'materialize s': '-',
      'commit MB/s': '-',
      'restore MB/s': '-',
      'commit cpu s': '-',
      'restore cpu s': '-',
      runs: 1,
      commit_s: 0,
      restore_s: ledgerImport,
    });
  }

  const table = rows.map(({ commit_s: _c, restore_s: _r, ...row }) => row);
  printTable(table);
  const [load1, load5] = os.loadavg();
  console.log(`\nload average at the end: ${load1!.toFixed(2)} (1 min), ${load5!.toFixed(2)} (5 min) on ${os.availableParallelism()} cores`);
  const big = SESSIONS > 0 ? rows[0] : undefined;
  const little = SMALL > 0 ? rows.find((r) => r.case === 'small') : undefined;
  const file = writeBenchResult(
    'storage',
    {
      commit_350kb_s: big ? round3(big.commit_s) : null,
      restore_350kb_s: big ? round3(big.restore_s) : null,
      commit_small_s: little ? round3(little.commit_s) : null,
      restore_small_s: little ? round3(little.restore_s) : null,
      restore_350kb_eager_s: big ? round3(Number(big['eager restore s'])) : null,
      materialize_350kb_s: big && typeof big['materialize s'] === 'number' ? big['materialize s'] : null,
      ledger_import_s: ledgerImport === null ? null : round3(ledgerImport),
    },
    table,
  );
  console.log(`\nwrote ${path.relative(process.cwd(), file)}`);
}

await main();
