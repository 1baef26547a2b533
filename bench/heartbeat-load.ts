// heartbeat-load: what parked, heartbeating activities cost the dev server while nothing else runs.
//
//   npm run bench -- heartbeat-load [--parked 2000] [--heartbeat-timeout 30] [--heartbeat-timeout 120] [--dev-config KEY=VALUE]
//                                   [--settle-s 70] [--window-s 30]
//
// For each heartbeat timeout: a fresh dev server (SQLite file, our defaults), N workflows that
// each park one activity heartbeating through activities/activity-context.ts `heartbeating`, as a
// `/run` does; after --settle-s the server's and this process's CPU seconds over --window-s. The
// SDK sends a heartbeat every 0.8 × the heartbeat timeout (the worker's throttle cap raised as in
// worker.ts), so N / (0.8 × timeout) per second. 120 s is the default `controller.run_heartbeat_timeout_s`.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Client, Connection } from '@temporalio/client';
import { DefaultLogger, NativeConnection, Runtime, Worker } from '@temporalio/worker';
import { heartbeating } from '../activities/activity-context.js';
import { freePort, startDevServer } from '../scripts/temporal-dev.mjs';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';
import { processGroupCpuSeconds, sleep } from './scale.js';

async function measure(
  parked: number,
  heartbeatTimeoutS: number,
  settleS: number,
  windowS: number,
  devConfig: Record<string, string | number | boolean>,
): Promise<Row> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-heartbeat-'));
  const server = await startDevServer({ port: await freePort(), headless: true, dbFile: join(dir, 'temporal.sqlite'), extraDynamicConfig: devConfig });
  let release: () => void = () => undefined;
  const released = new Promise<void>((r) => (release = r));
  try {
    const worker = await Worker.create({
      connection: await NativeConnection.connect({ address: server.address }),
      taskQueue: 'heartbeat-load',
      workflowsPath: fileURLToPath(new URL('./lib/parked-workflow.ts', import.meta.url)),
      activities: { park: () => heartbeating({ op: 'park' }, () => released) },
      maxConcurrentActivityTaskExecutions: parked + 10,
      maxHeartbeatThrottleInterval: '1 hour',
    });
    const client = new Client({ connection: await Connection.connect({ address: server.address }) });
    return await worker.runUntil(async () => {
      const ids = Array.from({ length: parked }, (_, i) => `parked-${i}`);
      for (let i = 0; i < ids.length; i += 100) {
        await Promise.all(
          ids
            .slice(i, i + 100)
            .map((workflowId) => client.workflow.start('parkedRollout', { taskQueue: 'heartbeat-load', workflowId, args: [heartbeatTimeoutS] })),
        );
      }
      await sleep(settleS * 1000);
      const s0 = await processGroupCpuSeconds(server.pid!);
      const w0 = process.cpuUsage();
      await sleep(windowS * 1000);
      const serverCpu = (await processGroupCpuSeconds(server.pid!)) - s0;
      const w = process.cpuUsage(w0);
      release();
      const releasedAt = Date.now();
      await Promise.all(
        ids.map((id) =>
          client.workflow
            .getHandle(id)
            .result()
            .catch(() => undefined),
        ),
      );
      return {
        parked,
        heartbeat_timeout_s: heartbeatTimeoutS,
        heartbeats_per_s: round3(parked / (0.8 * heartbeatTimeoutS)),
        window_s: windowS,
        server_cpu_s: round3(serverCpu),
        server_cores: round3(serverCpu / windowS),
        worker_cpu_s: round3((w.user + w.system) / 1e6),
        // From the release until every workflow ended: all N activities complete at once.
        release_to_done_s: round3((Date.now() - releasedAt) / 1000),
      };
    });
  } finally {
    release();
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      parked: { type: 'string', default: '2000' },
      'heartbeat-timeout': { type: 'string', multiple: true },
      'settle-s': { type: 'string', default: '70' },
      'window-s': { type: 'string', default: '30' },
      // A dev-server setting to compare (KEY=JSON, repeatable), e.g. --dev-config history.cacheMaxSize=32768.
      'dev-config': { type: 'string', multiple: true },
    },
  });
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const parked = Number(values.parked);
  const timeouts = (values['heartbeat-timeout'] ?? ['30', '120']).map(Number);
  const devConfig = Object.fromEntries(
    (values['dev-config'] ?? []).map((kv) => {
      const at = kv.indexOf('=');
      if (at < 1) throw new Error(`--dev-config takes KEY=VALUE, got '${kv}'`);
      return [kv.slice(0, at), JSON.parse(kv.slice(at + 1)) as string | number | boolean];
    }),
  );
  const rows: Row[] = [];
  for (const t of timeouts) {
    console.log(`heartbeat-load: ${parked} parked activities, heartbeat timeout ${t} s …`);
    rows.push(await measure(parked, t, Number(values['settle-s']), Number(values['window-s']), devConfig));
  }
  printTable(rows);
  const first = rows[0]!;
  const last = rows[rows.length - 1]!;
  const perBeat =
    rows.length > 1 && first.heartbeats_per_s !== last.heartbeats_per_s
      ? ((first.server_cpu_s as number) - (last.server_cpu_s as number)) /
        (((first.heartbeats_per_s as number) - (last.heartbeats_per_s as number)) * (first.window_s as number))
      : null;
  if (perBeat !== null) console.log(`server CPU per heartbeat: ${(perBeat * 1000).toFixed(2)} ms`);
  console.log(
    `wrote ${writeBenchResult('heartbeat-load', { parked, server_cores_first: first.server_cores as number, server_cpu_ms_per_heartbeat: perBeat === null ? null : round3(perBeat * 1000) }, rows)}`,
  );
}

await main();
