// The front of a multi-worker server hands a connection to a worker process (servers/workers/handoff.ts):
// no byte the caller sends after the request start may be read by the front, even while the send
// waits (Node sends one socket at a time and keeps the front's copy until the worker acknowledges
// it). A real child process and real sockets; the child is busy at first, so the second handoff
// waits behind the first's acknowledgement while the caller sends its second request.
import { type ChildProcess, fork } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, expect, it } from 'vitest';
import { handOff } from '../../servers/workers/handoff.js';
import { readRequestStart } from '../../servers/workers/request-start.js';

const CHILD = `
process.send('ready');
const busyUntil = Date.now() + 800;
while (Date.now() < busyUntil);
process.on('message', (message, socket) => {
  if (!socket) return;
  const chunks = [Buffer.from(message.bytes, 'base64')];
  socket.on('data', (c) => chunks.push(c));
  socket.on('end', () => {
    process.send({ got: Buffer.concat(chunks).toString('latin1') });
    socket.end();
  });
});
`;

const cleanup: Array<() => void> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c();
});

it('a byte sent while the handoff waits for the worker reaches the worker, not the front', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'handoff-'));
  writeFileSync(path.join(dir, 'child.cjs'), CHILD);
  const child: ChildProcess = fork(path.join(dir, 'child.cjs'), { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  cleanup.push(
    () => child.kill('SIGKILL'),
    () => rmSync(dir, { recursive: true, force: true }),
  );
  const got: string[] = [];
  const allGot = new Promise<void>((resolve) =>
    child.on('message', (m: unknown) => {
      if (typeof m === 'object' && m !== null && 'got' in m) got.push((m as { got: string }).got);
      if (got.length === 2) resolve();
    }),
  );
  await new Promise<void>((resolve) => child.once('message', () => resolve())); // 'ready': now busy

  const server = net.createServer((socket) => {
    void readRequestStart(socket, () => false, 0).then((start) => start && handOff(child, socket, start.bytes));
  });
  cleanup.push(() => server.close());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  const connect = async (): Promise<net.Socket> => {
    const c = net.connect(port, '127.0.0.1');
    await new Promise((r) => c.once('connect', r));
    cleanup.push(() => c.destroy());
    return c;
  };

  // The first handoff waits for the busy child's acknowledgement; the second queues behind it.
  const first = await connect();
  first.write('GET /one HTTP/1.1\r\nhost: a\r\n\r\n');
  const second = await connect();
  second.write('GET /two HTTP/1.1\r\nhost: a\r\n\r\n');
  await new Promise((r) => setTimeout(r, 200));
  // The next request on the queued connection, while its handle is still in this process.
  second.write('GET /three HTTP/1.1\r\nhost: a\r\n\r\n');
  await new Promise((r) => setTimeout(r, 100));
  first.end();
  second.end();
  await allGot;
  expect(got.sort()).toEqual(['GET /one HTTP/1.1\r\nhost: a\r\n\r\n', 'GET /two HTTP/1.1\r\nhost: a\r\n\r\nGET /three HTTP/1.1\r\nhost: a\r\n\r\n']);
});
