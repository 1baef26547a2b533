// `npm run demo [-- --keep]`: a dev server persisted under .data/demo/, a Worker, one workflow,
// and the Web UI link to its history. With --keep the server stays up (and a later demo reuses it).
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, Connection } from '@temporalio/client';
import { DefaultLogger, NativeConnection, Runtime, Worker } from '@temporalio/worker';
import { projectRoot } from './temporal-paths.mjs';
import { freePort, isPortFree, startDevServer } from './temporal-dev.mjs';
import * as activities from './demo-hello/activities.js';
import { hello } from './demo-hello/workflows.js';

interface KeptServer {
  pid: number;
  address: string;
  uiUrl: string;
}

const demoDir = join(projectRoot, '.data', 'demo');
const keptFile = join(demoDir, 'server.json');
const keep = process.argv.includes('--keep');

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** A server left by an earlier `--keep` owns the database file: reuse it rather than start a second one. */
function keptServer(): KeptServer | undefined {
  if (!existsSync(keptFile)) return undefined;
  const kept = JSON.parse(readFileSync(keptFile, 'utf8')) as KeptServer;
  if (isAlive(kept.pid)) return kept;
  rmSync(keptFile, { force: true });
  return undefined;
}

async function main(): Promise<void> {
  Runtime.install({ logger: new DefaultLogger('WARN') });

  let kept = keptServer();
  let stop: (() => Promise<void>) | undefined;
  if (kept) {
    console.log(`Reusing the dev server left running by --keep (pid ${kept.pid}) on ${kept.address}`);
  } else {
    const port = (await isPortFree(7233)) ? 7233 : await freePort();
    const uiPort = (await isPortFree(8233)) ? 8233 : await freePort();
    const server = await startDevServer({ port, uiPort, dbFile: join(demoDir, 'temporal.sqlite') });
    console.log(`Started a Temporal dev server (pid ${server.pid}) on ${server.address}; log: ${server.logFile}`);
    kept = { pid: server.pid!, address: server.address, uiUrl: server.uiUrl! };
    if (keep) {
      server.keepRunning();
      writeFileSync(keptFile, `${JSON.stringify(kept, null, 2)}\n`);
    } else {
      stop = () => server.stop();
      // Ctrl-C mid-demo: stop the server gracefully rather than leave it to the exit hook.
      for (const sig of ['SIGINT', 'SIGTERM'] as const) {
        process.once(sig, () => void server.stop().finally(() => process.exit(130)));
      }
    }
  }

  try {
    const taskQueue = 'demo-hello';
    const workflowId = `hello-${new Date().toISOString().replace(/[:.]/g, '-')}`;
    const connection = await Connection.connect({ address: kept.address });
    const client = new Client({ connection });
    const workerConnection = await NativeConnection.connect({ address: kept.address });
    const worker = await Worker.create({
      connection: workerConnection,
      taskQueue,
      workflowsPath: fileURLToPath(new URL('./demo-hello/workflows.ts', import.meta.url)),
      activities,
    });
    const result = await worker.runUntil(client.workflow.execute(hello, { taskQueue, workflowId, args: ['Gym'] }));
    await Promise.all([connection.close(), workerConnection.close()]);

    console.log(`\nWorkflow ${workflowId} returned: ${result}`);
    console.log(`Web UI: ${kept.uiUrl}/namespaces/default/workflows/${workflowId}`);
  } finally {
    await stop?.();
  }

  if (stop) {
    console.log('\nDev server stopped; its history stays in .data/demo/ (run with --keep to browse the UI).');
  } else {
    console.log(`\nThe dev server keeps running (pid ${kept.pid}). Stop it with: kill ${kept.pid}`);
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
