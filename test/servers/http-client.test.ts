// The data-plane client's two pools over real sockets on 127.0.0.1: short calls share at most
// SHORT_CALL_CONNECTIONS connections per server (the rest wait in the client), held calls each get
// their own (a Gym gate may park thousands of them on one server at once).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { SHORT_CALL_CONNECTIONS, callJson, closeDataAgent } from '../../servers/common/http-client.js';
import { waitFor } from '../helpers/wait.js';

/** A server that holds every request until released, and counts the connections it was opened. */
class HoldingServer {
  server!: Server;
  url = '';
  connections = 0;
  held: ServerResponse[] = [];
  holding = true;

  async start(): Promise<void> {
    this.server = createServer((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        if (this.holding) this.held.push(res);
        else this.answer(res);
      });
    });
    this.server.on('connection', () => this.connections++);
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  answer(res: ServerResponse): void {
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
  }

  releaseAll(): void {
    this.holding = false;
    for (const res of this.held.splice(0)) this.answer(res);
  }

  async stop(): Promise<void> {
    this.releaseAll();
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

describe('data-plane HTTP pools', () => {
  let s: HoldingServer;
  afterEach(async () => {
    await closeDataAgent();
    await s.stop();
  });
  afterAll(closeDataAgent);

  it('short calls past the cap wait for a connection instead of opening one each', async () => {
    s = new HoldingServer();
    await s.start();
    const n = SHORT_CALL_CONNECTIONS + 40;
    const calls = Array.from({ length: n }, (_, i) => callJson(s.url, '/verify', { i }));
    await waitFor(() => s.held.length === SHORT_CALL_CONNECTIONS, 10_000);
    // Give any extra connection time to show up: none may.
    await new Promise((r) => setTimeout(r, 200));
    expect(s.connections).toBe(SHORT_CALL_CONNECTIONS);
    expect(s.held.length).toBe(SHORT_CALL_CONNECTIONS);
    s.releaseAll();
    const replies = await Promise.all(calls);
    expect(replies.every((r) => r.status === 200 && (r.body as { ok: boolean }).ok)).toBe(true);
    expect(s.connections).toBe(SHORT_CALL_CONNECTIONS);
  });

  it('held calls each get a connection of their own', async () => {
    s = new HoldingServer();
    await s.start();
    const n = SHORT_CALL_CONNECTIONS + 40;
    const calls = Array.from({ length: n }, (_, i) => callJson(s.url, '/v1/chat/completions', { i }, { held: true }));
    await waitFor(() => s.held.length === n, 10_000);
    expect(s.connections).toBe(n);
    // A short call is not stuck behind the held ones.
    s.holding = false;
    const short = await callJson(s.url, '/verify', {});
    expect(short.status).toBe(200);
    s.releaseAll();
    expect((await Promise.all(calls)).every((r) => r.status === 200)).toBe(true);
  });
});
