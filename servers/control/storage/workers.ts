// The storage worker threads, pooled by piscina and started on first use from real modules: the
// hash thread from hash-thread.mjs, the scan threads from worker-entry.mjs → worker.ts. Idle
// threads do not keep a process alive.
import os from 'node:os';
import { Piscina } from 'piscina';
import type { ScanTask, ScannedChunk } from './worker.js';

type HashTask = { op: 'update'; stream: number; data: Uint8Array } | { op: 'digest' | 'drop'; stream: number };

const scanFilename = new URL('./worker-entry.mjs', import.meta.url).href;
const hashFilename = new URL('./hash-thread.mjs', import.meta.url).href;

// `execArgv: []`: a thread does not inherit the process's tsx loader flags. The hash thread needs
// no TypeScript at all, and worker-entry.mjs registers tsx itself; inherited, the loader is set up
// once more per thread, a few hundred ms of CPU inside the first commit or restore of a process.
let hashPool: Piscina | undefined;
let scanPool: Piscina | undefined;

/** One thread: its tasks run in the order given, which is what a running hash needs. */
export function runHash(task: HashTask): Promise<{ bytes: number; hex?: string }> {
  hashPool ??= new Piscina({ filename: hashFilename, minThreads: 1, maxThreads: 1, execArgv: [] });
  return hashPool.run(task);
}

/** Scan threads: one per core, up to 4 (a restore's parse is spread over them). */
export const SCAN_THREADS = Math.max(1, Math.min(4, os.availableParallelism()));

export function runScan(task: ScanTask): Promise<ScannedChunk> {
  scanPool ??= new Piscina({ filename: scanFilename, name: 'scan', minThreads: SCAN_THREADS, maxThreads: SCAN_THREADS, execArgv: [] });
  return scanPool.run(task);
}
