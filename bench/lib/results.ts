// Shared by every benchmark: print a small table and write `bench/results/<name>.json` with the
// machine it ran on, so a figure is never quoted without its hardware and commit.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export type Cell = string | number | boolean | null;
export type Row = Record<string, Cell>;

export interface Machine {
  cores: number;
  memory_gb: number;
  node: string;
  /** `git rev-parse HEAD` when the benchmark started, or null outside a repository / before the first commit. */
  commit: string | null;
  /** 1-minute load average when the result was written: a busy machine makes every figure worse. */
  load_avg_1m: number;
  /**
   * Share of the machine's CPU time the hypervisor gave to other guests while the benchmark ran
   * (`steal` in /proc/stat, since this module loaded); null off Linux. A VM's neighbours make every
   * figure slower without any load showing here.
   */
  cpu_steal_pct: number | null;
}

export interface BenchResult {
  name: string;
  machine: Machine;
  figures: Record<string, number | null>;
  rows: Row[];
}

const BENCH_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const RESULTS_DIR = path.join(BENCH_DIR, 'results');

/** The `cpu` line of /proc/stat: every field's jiffies, and `steal` (the 8th). */
function cpuTimes(): { total: number; steal: number } | null {
  try {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
    if (fields.length < 8 || fields.some((n) => !Number.isFinite(n))) return null;
    // guest and guest_nice are already counted in user and nice.
    return { total: fields.slice(0, 8).reduce((a, b) => a + b, 0), steal: fields[7]! };
  } catch {
    return null;
  }
}

const CPU_AT_START = cpuTimes();

/** Steal since this module loaded, in % of all CPU time (1 decimal). */
export function cpuStealPct(): number | null {
  const now = cpuTimes();
  if (!CPU_AT_START || !now || now.total <= CPU_AT_START.total) return null;
  return Math.round((1000 * (now.steal - CPU_AT_START.steal)) / (now.total - CPU_AT_START.total)) / 10;
}

/** `git rev-parse HEAD` when the benchmark started: the code it loaded (a commit made during a long run is not it). */
function headCommit(): string | null {
  try {
    return (
      execFileSync('git', ['rev-parse', 'HEAD'], { cwd: BENCH_DIR, stdio: ['ignore', 'pipe', 'ignore'] })
        .toString()
        .trim() || null
    );
  } catch {
    return null;
  }
}

const COMMIT_AT_START = headCommit();

export function machine(): Machine {
  const commit = COMMIT_AT_START;
  return {
    cores: os.availableParallelism?.() ?? os.cpus().length,
    memory_gb: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    node: process.version,
    commit,
    load_avg_1m: Math.round(os.loadavg()[0]! * 100) / 100,
    cpu_steal_pct: cpuStealPct(),
  };
}

/** The machine in one line, for the bench's output beside its figures. */
export function machineLine(m: Machine): string {
  const steal = m.cpu_steal_pct === null ? 'unknown' : `${m.cpu_steal_pct} %`;
  return `machine: ${m.cores} cores, ${m.memory_gb} GB, Node ${m.node}, commit ${m.commit?.slice(0, 7) ?? 'none'}, load ${m.load_avg_1m}, CPU steal during the run ${steal}`;
}

/** Writes `bench/results/<name>.json`, prints its machine line, and returns its path. */
export function writeBenchResult(name: string, figures: Record<string, number | null>, rows: Row[]): string {
  const result: BenchResult = { name, machine: machine(), figures, rows };
  console.log(machineLine(result.machine));
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
