// The last lines of every Gym server's log in a launched deployment (`<run dir>/logs/*.log`), for a
// bench whose attempts failed: the servers run at LOG_LEVEL=error, so what is there is why.
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { LOGS_DIR } from '../../servers/launcher/run-dir.js';

export async function logTails(runDir: string, lines = 20): Promise<Array<{ server: string; tail: string[] }>> {
  const dir = join(runDir, LOGS_DIR);
  const files = (await readdir(dir).catch(() => [] as string[])).filter((f) => f.endsWith('.log')).sort();
  const tails = await Promise.all(
    files.map(async (f) => {
      const text = await readFile(join(dir, f), 'utf8').catch(() => '');
      return {
        server: f.replace(/\.log$/, ''),
        tail: text
          .split('\n')
          .filter((l) => l.trim() !== '')
          .slice(-lines),
      };
    }),
  );
  return tails.filter((t) => t.tail.length > 0);
}
