// Readiness of a launched server: its `/healthz` answers 200 naming this server (a different
// process still holding the port does not count). Plain node:http without keep-alive, so a CLI
// that probed does not linger on idle sockets.
import { get } from 'node:http';
import { setTimeout as delay } from 'node:timers/promises';

export function probeHealth(url: string, name: string, timeoutMs = 1_000): Promise<boolean> {
  return new Promise((resolve) => {
    const req = get(`${url}/healthz`, { agent: false, timeout: timeoutMs }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => {
        if (res.statusCode !== 200) return resolve(false);
        try {
          const body = JSON.parse(text) as { server?: unknown };
          resolve(body.server === undefined || body.server === name);
        } catch {
          resolve(false);
        }
      });
      res.on('error', () => resolve(false));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
  });
}

export type HealthOutcome = 'healthy' | 'exited' | 'timeout';

/** Polls until healthy, until `exited` settles (the process died) or until the timeout. */
export async function waitHealthy(url: string, name: string, opts: { timeoutMs: number; exited?: Promise<unknown> }): Promise<HealthOutcome> {
  let dead = false;
  void opts.exited?.then(() => (dead = true));
  const deadline = Date.now() + opts.timeoutMs;
  for (;;) {
    if (await probeHealth(url, name)) return 'healthy';
    if (dead) return 'exited';
    if (Date.now() >= deadline) return 'timeout';
    await delay(100);
  }
}
