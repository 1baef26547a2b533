// The benchmark dispatcher:
//   npm run bench -- <name> [args…]     runs bench/<name>.ts with the args passed through
//   npm run bench -- --list             lists the benchmarks
// Each benchmark runs as `node --import tsx bench/<name>.ts …` in its own process (a benchmark
// exits when it is done, and its CPU profile, `--cpu-prof`, covers only it); the exit code is
// forwarded. Node flags go before the name: `npm run bench -- --cpu-prof scale --rollouts 500`.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const BENCH_DIR = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(BENCH_DIR, '..');

export const BENCHMARKS: Readonly<Record<string, string>> = {
  storage: 'manifest-last storage: commit/restore throughput of records files',
  model: 'the policy model participant in-process at scale (prepare/commit/restore of N calls)',
  scale: 'a real Gym deployment: N rollouts held in flight, checkpoint, SIGKILL, restore, redispatch',
  'controller-overhead': 'the same rollouts by a plain /run driver and through the Temporal controller',
  'checkpoint-cost': 'a training run with checkpointing on vs off: throughput and per-step checkpoint time',
  'controller-scale': 'N rollouts in flight through the Temporal controller, K checkpoints of them (--checkpoints K)',
  'heartbeat-load': 'what parked, heartbeating activities (like /run) cost the dev server while idle',
};

/** Node flags we let through to the benchmark process (profiling, heap). */
const NODE_FLAG = /^--(trace-gc|cpu-prof|cpu-prof-dir=.*|cpu-prof-interval=.*|heap-prof|max-old-space-size=.*|expose-gc|inspect.*)$/;

function usage(): string {
  const width = Math.max(...Object.keys(BENCHMARKS).map((n) => n.length));
  return [
    'usage: npm run bench -- [node flags] <name> [args…]   |   npm run bench -- --list',
    '',
    ...Object.entries(BENCHMARKS).map(([n, d]) => `  ${n.padEnd(width)}  ${d}`),
  ].join('\n');
}

function main(argv: string[]): void {
  const nodeFlags: string[] = [];
  let i = 0;
  for (; i < argv.length && NODE_FLAG.test(argv[i]!); i++) nodeFlags.push(argv[i]!);
  const name = argv[i];
  // Only in the name's place: later args belong to the benchmark.
  if (name === '--list' || name === '--help' || name === '-h') {
    console.log(usage());
    process.exit(0);
  }
  if (name === undefined || !(name in BENCHMARKS)) {
    console.error(name === undefined ? 'bench: name a benchmark' : `bench: unknown benchmark '${name}'`);
    console.error(usage());
    process.exit(2);
  }
  const child = spawn(process.execPath, [...nodeFlags, '--import', 'tsx', path.join(BENCH_DIR, `${name}.ts`), ...argv.slice(i + 1)], {
    cwd: ROOT,
    stdio: 'inherit',
  });
  // Ctrl-C reaches the child through the terminal's process group: we only wait for it.
  // A SIGTERM sent to us alone is passed on.
  process.on('SIGINT', () => undefined);
  process.on('SIGTERM', () => child.kill('SIGTERM'));
  child.on('error', (err) => {
    console.error(`bench: cannot start ${name}: ${err.message}`);
    process.exit(1);
  });
  child.on('exit', (code, signal) => {
    if (signal) {
      console.error(`bench: ${name} ended by ${signal}`);
      process.exit(1);
    }
    process.exit(code ?? 1);
  });
}

main(process.argv.slice(2));
