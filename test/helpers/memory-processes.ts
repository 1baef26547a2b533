// Starts memory participants as real processes (own process groups) for coordination tests.
import { fileURLToPath } from 'node:url';
import type { Kind } from '../../protocol/ids.js';
import { spawnGroup, waitForLine, type GroupProcess } from '../../servers/launcher/process-group.js';

const SERVER = fileURLToPath(new URL('../participants/memory-server.ts', import.meta.url));
const TSX = fileURLToPath(new URL('../../node_modules/.bin/tsx', import.meta.url));

export interface MemoryProcess {
  name: string;
  kind: Kind;
  url: string;
  proc: GroupProcess;
}

export async function startMemoryProcess(name: string, kind: Kind, token: string, port = 0): Promise<MemoryProcess> {
  const proc = spawnGroup({
    command: TSX,
    args: [SERVER, '--instance', name, '--kind', kind, '--port', String(port)],
    env: { ...process.env, GYM_CONTROL_TOKEN: token, LOG_LEVEL: 'silent' },
  });
  try {
    const m = await waitForLine(proc, /^LISTENING (\d+)$/, 60_000);
    return { name, kind, url: `http://127.0.0.1:${m[1]}`, proc };
  } catch (err) {
    await proc.kill();
    throw err;
  }
}
