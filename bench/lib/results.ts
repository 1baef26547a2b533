// Shared by every benchmark: print a small table and write `bench/results/<name>.json` with the
// machine it ran on, so a figure is never quoted without its hardware and commit.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export type Cell = string | number | boolean | null;
export type Row = Record<string, Cell>;

export interface Machine {
  cores: number;
  memory_gb: number;
  node: string;
  /** `git rev-parse HEAD`, or null outside a repository / before the first commit. */
  commit: string | null;
  /** 1-minute load average when the result was written: a busy machine makes every figure worse. */
  load_avg_1m: number;
}

export interface BenchResult {
  name: string;
  machine: Machine;
  figures: Record<string, number | null>;
  rows: Row[];
}

const BENCH_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const RESULTS_DIR = path.join(BENCH_DIR, 'results');

export function machine(): Machine {
  let commit: string | null = null;
  try {
    commit =
      execFileSync('git', ['rev-parse', 'HEAD'], { cwd: BENCH_DIR, stdio: ['ignore', 'pipe', 'ignore'] })
        .toString()
        .trim() || null;
  } catch {
    commit = null;
  }
  return {
    cores: os.availableParallelism?.() ?? os.cpus().length,
    memory_gb: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    node: process.version,
    commit,
    load_avg_1m: Math.round(os.loadavg()[0]! * 100) / 100,
  };
}

/** Writes `bench/results/<name>.json` and returns its path. */
export function writeBenchResult(name: string, figures: Record<string, number | null>, rows: Row[]): string {
  const result: BenchResult = { name, machine: machine(), figures, rows };
  mkdirSync(RESULTS_DIR, { recursive: true });
  const file = path.join(RESULTS_DIR, `${name}.json`);
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  return file;
}

/** Rounds seconds (or any figure) for tables and JSON: 3 decimals. */
export function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/** Prints rows as an aligned text table; columns are the union of the rows' keys, in order. */
export function printTable(rows: Row[], out: (line: string) => void = (l) => console.log(l)): void {
  if (rows.length === 0) return;
  const cols: string[] = [];
  for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
  const cell = (v: Cell | undefined) => (v === undefined || v === null ? '' : String(v));
  const width = cols.map((c) => Math.max(c.length, ...rows.map((r) => cell(r[c]).length)));
  const numeric = cols.map((c) => rows.every((r) => r[c] === undefined || r[c] === null || typeof r[c] === 'number'));
  const fmt = (vals: string[]) =>
    vals
      .map((v, i) => (numeric[i] ? v.padStart(width[i]!) : v.padEnd(width[i]!)))
      .join('  ')
      .trimEnd();
  out(fmt(cols));
  out(fmt(width.map((w) => '-'.repeat(w))));
  for (const r of rows) out(fmt(cols.map((c) => cell(r[c]))));
}
