// CPU time by process on this machine, sampled from /proc, to see where a window of a benchmark
// went (docs/performance.md: a checkpoint's CPU at 16,000). Linux only; reads, never signals.
//
//   node bench/tools/cpu-by-process.mjs sample OUT.jsonl [intervalMs]   one JSON line per interval
//   node bench/tools/cpu-by-process.mjs window OUT.jsonl START DURATION_MS   CPU ms per class in it
//
// START is an ISO time or epoch ms (controller-scale prints when it asks each checkpoint with
// BENCH_VERBOSE=1). Classes: `temporal` (the dev server), `bench` (the bench process, also split by
// thread: `bench:main` and `bench:t<tid>`; Node names every thread "node", so the thread IDs are
// told apart by what they do), `gym:<server>` (a front or single process) and `gym:<server>:w`
// (its worker processes), anything else by its command line.
import { appendFileSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';

const TICK_MS = 10; // USER_HZ is 100 on Linux

function ticksOf(statLine) {
  const f = statLine.slice(statLine.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * TICK_MS;
}

function read(path) {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

function classOf(pid) {
  const cmd = read(`/proc/${pid}/cmdline`)?.replace(/\0/g, ' ');
  if (cmd === undefined) return undefined;
  if (/temporal.*server start-dev/.test(cmd)) return 'temporal';
  if (/bench\/[a-z-]+\.ts/.test(cmd)) return 'bench';
  const name = cmd.match(/--name[ =](\S+)/)?.[1];
  if (name) return /--worker\b|workers\/worker/.test(cmd) ? `gym:${name}:w` : `gym:${name}`;
  return cmd.slice(0, 60) || undefined;
}

function sample(out, intervalMs) {
  const last = new Map();
  const classes = new Map();
  writeFileSync(out, '');
  const delta = (key, ms) => {
    const before = last.get(key);
    last.set(key, ms);
    return before === undefined ? 0 : Math.max(0, ms - before);
  };
  setInterval(() => {
    const line = { t: Date.now() };
    const add = (k, v) => {
      if (v > 0) line[k] = (line[k] ?? 0) + v;
    };
    for (const pid of readdirSync('/proc')) {
      if (!/^\d+$/.test(pid)) continue;
      const stat = read(`/proc/${pid}/stat`);
      if (stat === undefined) continue;
      if (!classes.has(pid)) classes.set(pid, classOf(pid) ?? 'other');
      const cls = classes.get(pid);
      add(cls, delta(pid, ticksOf(stat)));
      if (cls !== 'bench') continue;
      for (const tid of readdirSync(`/proc/${pid}/task`)) {
        const t = read(`/proc/${pid}/task/${tid}/stat`);
        if (t !== undefined) add(tid === pid ? 'bench:main' : `bench:t${tid}`, delta(`${pid}/${tid}`, ticksOf(t)));
      }
    }
    appendFileSync(out, `${JSON.stringify(line)}\n`);
  }, intervalMs);
}

function window(file, startArg, durationMs) {
  const start = /^\d+$/.test(startArg) ? Number(startArg) : Date.parse(startArg);
  const end = start + durationMs;
  const sum = {};
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (!line) continue;
    const o = JSON.parse(line);
    if (o.t <= start || o.t > end) continue;
    for (const [k, v] of Object.entries(o)) if (k !== 't') sum[k] = (sum[k] ?? 0) + v;
  }
  // Threads are inside `bench` already: counted once.
  const all = Object.entries(sum)
    .filter(([k]) => !k.startsWith('bench:'))
    .reduce((a, [, v]) => a + v, 0);
  console.log(`${durationMs} ms from ${new Date(start).toISOString()}: ${all} ms of CPU (${(all / durationMs).toFixed(2)} cores)`);
  for (const [k, v] of Object.entries(sum).sort((a, b) => b[1] - a[1])) console.log(`${String(v).padStart(8)}  ${k}`);
}

const [mode, file, a, b] = process.argv.slice(2);
if (mode === 'sample' && file) sample(file, Number(a ?? 100));
else if (mode === 'window' && file && a && b) window(file, a, Number(b));
else {
  console.error('usage: cpu-by-process.mjs sample OUT.jsonl [intervalMs] | window OUT.jsonl START DURATION_MS');
  process.exit(2);
}
