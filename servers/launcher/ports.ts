// Free TCP ports on 127.0.0.1, picked once at `up` and kept across restarts (endpoints.json).
import { createServer, type AddressInfo, type Server } from 'node:net';

function listen(port: number): Promise<Server | undefined> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', () => resolve(undefined));
    srv.listen(port, '127.0.0.1', () => resolve(srv));
  });
}

const close = (srv: Server): Promise<void> => new Promise((r) => srv.close(() => r()));

export async function isPortFree(port: number): Promise<boolean> {
  const srv = await listen(port);
  if (!srv) return false;
  await close(srv);
  return true;
}

/** `count` distinct free ports, none in `avoid`; all held open at once so the kernel cannot repeat one. */
export async function freePorts(count: number, avoid: ReadonlySet<number> = new Set()): Promise<number[]> {
  const held: Server[] = [];
  const ports: number[] = [];
  try {
    while (ports.length < count) {
      const srv = await listen(0);
      if (!srv) throw new Error('cannot listen on 127.0.0.1:0');
      held.push(srv);
      const port = (srv.address() as AddressInfo).port;
      if (!avoid.has(port)) ports.push(port);
    }
    return ports;
  } finally {
    await Promise.all(held.map(close));
  }
}
