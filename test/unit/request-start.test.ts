// What the front of a multi-worker server reads off a fresh connection before it hands it over
// (servers/workers/request-start.ts): the head, a /run's body when asked for, and nothing lost.
import net from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { MAX_HEAD_BYTES, readRequestStart, type RequestStart } from '../../servers/workers/request-start.js';

let servers: net.Server[] = [];
afterEach(() => {
  for (const s of servers) s.close();
  servers = [];
});

/** Sends `parts` (a pause between them) on a fresh connection; resolves with what the server side read. */
async function readOff(parts: Array<string | Buffer>, wantBody = (s: RequestStart) => s.method === 'POST', maxBody = 1024): Promise<RequestStart | undefined> {
  let result!: Promise<RequestStart | undefined>;
  const accepted = new Promise<void>((resolve) => {
    const server = net.createServer((socket) => {
      result = readRequestStart(socket, wantBody, maxBody);
      resolve();
    });
    servers.push(server);
    server.listen(0, '127.0.0.1');
  });
  await new Promise((r) => servers.at(-1)!.once('listening', r));
  const client = net.connect((servers.at(-1)!.address() as net.AddressInfo).port, '127.0.0.1');
  await accepted;
  for (const p of parts) {
    client.write(p);
    await new Promise((r) => setTimeout(r, 20));
  }
  const out = await Promise.race([result, new Promise<'pending'>((r) => setTimeout(() => r('pending'), 200))]);
  client.destroy();
  return out === 'pending' ? await result : out;
}

it('reads the head of a request split over several packets, keeping every byte', async () => {
  const head = 'GET /ng-rollout/r1-a2/v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Thing:  v \r\n\r\n';
  const start = await readOff([head.slice(0, 10), head.slice(10)]);
  expect(start).toMatchObject({ method: 'GET', target: '/ng-rollout/r1-a2/v1/models?x=1' });
  expect(start!.headers.get('x-thing')).toBe('v');
  expect(start!.bytes.toString()).toBe(head);
  expect(start!.body).toBeUndefined();
});

it('waits for the content-length body when asked, and stops there', async () => {
  const body = JSON.stringify({ episode_id: { rollout_id: 'r9', attempt: 0 } });
  const head = `POST /run HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`;
  const start = await readOff([head + body.slice(0, 5), body.slice(5)]);
  expect(start!.body!.toString()).toBe(body);
  expect(start!.bytes.toString()).toBe(head + body);
});

it('does not wait for a chunked or too large body; a garbled or oversized head is marked malformed; a closed connection is undefined', async () => {
  const chunked = await readOff(['POST /run HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n']);
  expect(chunked!.body).toBeUndefined();
  const large = await readOff(['POST /run HTTP/1.1\r\ncontent-length: 5000\r\n\r\n{']);
  expect(large!.body).toBeUndefined();
  expect((await readOff(['NOT HTTP\r\n\r\n']))!.malformed).toBe(true);
  expect((await readOff([Buffer.alloc(MAX_HEAD_BYTES + 10, 97)]))!.malformed).toBe(true);
  expect(await readOff(['GET / HTTP/1.1\r\n'])).toBeUndefined();
});
