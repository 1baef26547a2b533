// The storage worker threads, pooled by piscina and started on first use from a real module
// (worker-entry.mjs → worker.ts). Idle threads do not keep a process alive.
import os from 'node:os';
import { Piscina } from 'piscina';
import type { HashTask, ScanTask, ScannedChunk } from './worker.js';

const filename = new URL('./worker-entry.mjs', import.meta.url).href;

let hashPool: Piscina | undefined;
let scanPool: Piscina | undefined;

/** One thread: its tasks run in the order given, which is what a running hash needs. */
export function runHash(task: HashTask): Promise<{ bytes: number; hex?: string }> {
  hashPool ??= new Piscina({ filename, name: 'hash', minThreads: 1, maxThreads: 1 });
  return hashPool.run(task);
}

/** Scan threads: one per core, up to 4 (a restore's parse is spread over them). */
export const SCAN_THREADS = Math.max(1, Math.min(4, os.availableParallelism()));

export function runScan(task: ScanTask): Promise<ScannedChunk> {
  scanPool ??= new Piscina({ filename, name: 'scan', minThreads: SCAN_THREADS, maxThreads: SCAN_THREADS });
  return scanPool.run(task);
}
