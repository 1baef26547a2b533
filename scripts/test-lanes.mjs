// `npm test`: the suite in two lanes at once, each one file at a time: the end-to-end files (each
// starts a Temporal dev server, Gym processes and a worker) and the rest (unit, contract,
// in-process servers, time-skipping workflow tests, and a few short e2e files) beside them. Much
// of an e2e file's time is spent waiting on its processes, and the other lane uses the cores
// meanwhile; one vitest cannot do this (it puts projects that run one file at a time into one
// sequential group).
//
// `npm test -- <args>`: options alone (`--reporter=…`, `--outputFile.json=FILE`) go to both lanes,
// and the JSON reports are merged into FILE; anything else (a file filter, `-t NAME`) runs one
// vitest with those arguments, as `vitest run` would.
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const E2E = 'test/e2e/';
// End-to-end files that run in the other lane, so both lanes take about as long (the e2e lane was
// the longer by minutes): short ones whose processes mostly wait.
const E2E_IN_REST_LANE = [
  'test/e2e/coordination.test.ts',
  'test/e2e/gym/counter.test.ts',
  'test/e2e/gym/genrm.test.ts',
  'test/e2e/gym/restart.test.ts',
  'test/e2e/gym/verify.test.ts',
  'test/e2e/run-cli.test.ts',
];
const args = process.argv.slice(2);
const vitest = new URL('../node_modules/vitest/vitest.mjs', import.meta.url).pathname;

if (!args.every((a) => a.startsWith('--'))) process.exit(await run(null, ['run', ...args]));

const jsonOut = args.find((a) => a.startsWith('--outputFile.json='))?.slice('--outputFile.json='.length);
const e2eLane = readdirSync(E2E, { recursive: true })
  .map((f) => `${E2E}${f}`)
  .filter((f) => f.endsWith('.test.ts') && !E2E_IN_REST_LANE.includes(f));
const lanes = [
  { name: 'e2e', filter: e2eLane },
  { name: 'rest', filter: e2eLane.flatMap((f) => ['--exclude', f]) },
];
const codes = await Promise.all(
  lanes.map((lane) => {
    const laneArgs = args.map((a) => (jsonOut && a.startsWith('--outputFile.json=') ? `--outputFile.json=${jsonOut}.${lane.name}` : a));
    return run(lane.name, ['run', ...lane.filter, ...laneArgs]);
  }),
);
if (jsonOut)
  mergeReports(
    jsonOut,
    lanes.map((lane) => `${jsonOut}.${lane.name}`),
  );
process.exit(codes.find((c) => c !== 0) ?? 0);

/** Runs vitest; a lane's output lines carry its name. Resolves to the exit code. */
function run(lane, vitestArgs) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [vitest, ...vitestArgs], { stdio: lane ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
    if (lane) {
      for (const [stream, out] of [
        [child.stdout, process.stdout],
        [child.stderr, process.stderr],
      ]) {
        createInterface({ input: stream }).on('line', (line) => out.write(`[${lane}] ${line}\n`));
      }
    }
    child.on('exit', (code, signal) => resolve(code ?? (signal ? 1 : 0)));
  });
}

/** One JSON report of both lanes: counts added, test results joined, success only if both succeeded. */
function mergeReports(file, parts) {
  const reports = [];
  for (const part of parts) {
    try {
      reports.push(JSON.parse(readFileSync(part, 'utf8')));
    } catch {
      // A lane that wrote no report: .ci/run notices the missing results (its exit code is not 0).
    }
    rmSync(part, { force: true });
  }
  if (reports.length === 0) return;
  const merged = { ...reports[0], testResults: [], success: reports.length === parts.length };
  for (const key of Object.keys(merged)) if (key.startsWith('num')) merged[key] = 0;
  for (const r of reports) {
    for (const [key, value] of Object.entries(r)) if (key.startsWith('num') && typeof value === 'number') merged[key] += value;
    merged.testResults.push(...(r.testResults ?? []));
    merged.success &&= r.success !== false;
    merged.startTime = Math.min(merged.startTime ?? r.startTime, r.startTime ?? merged.startTime);
  }
  writeFileSync(file, JSON.stringify(merged));
}
