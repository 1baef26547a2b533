import net from 'node:net';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { ControlTransportError, callTimeoutMs, controlCall, createControlPool, encodeBody, joinUrl } from '../../activities/control-client.js';
import { sleep } from '../helpers/wait.js';

const apps: FastifyInstance[] = [];
const rawServers: net.Server[] = [];
const sockets = new Set<net.Socket>();

afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
  for (const s of sockets) s.destroy();
  sockets.clear();
  await Promise.all(rawServers.splice(0).map((s) => new Promise((r) => s.close(r))));
});
const pool = createControlPool();
afterAll(async () => {
  await pool.close();
});

async function server(build: (app: FastifyInstance) => void): Promise<string> {
  const app = Fastify({ forceCloseConnections: true });
  build(app);
  await app.listen({ host: '127.0.0.1', port: 0 });
  apps.push(app);
  return `http://127.0.0.1:${(app.server.address() as net.AddressInfo).port}`;
}

async function silentServer(): Promise<string> {
  const srv = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => {});
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  rawServers.push(srv);
  return `http://127.0.0.1:${(srv.address() as net.AddressInfo).port}`;
}

describe('controlCall', () => {
  it('sends the bytes as given with JSON content type and bearer; parses JSON or keeps text', async () => {
    let seen: { raw: string; ct?: string; auth?: string } | undefined;
    const url = await server((app) => {
      app.addContentTypeParser('application/json', { parseAs: 'string' }, (_r, b, done) => done(null, b));
      app.post('/base/json', async (req) => {
        seen = { raw: req.body as string, ct: req.headers['content-type'], auth: req.headers.authorization };
        return { ok: true };
      });
      app.post('/base/text', async (_req, reply) => reply.code(500).type('text/plain').send('Internal Server Error'));
    });
    const body = encodeBody({ b: 1, a: [1.5] });
    const res = await controlCall({ url: `${url}/base/`, method: 'POST', path: '/json', token: 'tok', body, timeoutMs: 5000, dispatcher: pool });
    expect(res).toEqual({ status: 200, body: { ok: true } });
    expect(seen).toEqual({ raw: '{"b":1,"a":[1.5]}', ct: 'application/json', auth: 'Bearer tok' });
    const text = await controlCall({ url: `${url}/base`, method: 'POST', path: '/text', token: 'tok', body: '{}', timeoutMs: 5000, dispatcher: pool });
    expect(text).toEqual({ status: 500, body: 'Internal Server Error' });
  });

  it('times out a server that never replies', async () => {
    const url = await silentServer();
    const err = await controlCall({ url, method: 'GET', path: '/x', token: 't', timeoutMs: 150, dispatcher: pool }).catch((e) => e);
    expect(err).toBeInstanceOf(ControlTransportError);
    expect(err.reason).toBe('timeout');
    expect(err.message).toBe('no reply within 0.15 seconds');
  });

  it('aborts on the caller signal', async () => {
    const url = await silentServer();
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    const err = await controlCall({ url, method: 'GET', path: '/x', token: 't', timeoutMs: 10_000, signal: ac.signal, dispatcher: pool }).catch((e) => e);
    expect(err).toBeInstanceOf(ControlTransportError);
    expect(err.reason).toBe('aborted');
  });

  it('reports a refused connection as a connection error', async () => {
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    await new Promise<void>((r) => srv.close(() => r()));
    const err = await controlCall({ url: `http://127.0.0.1:${port}`, method: 'GET', path: '/x', token: 't', timeoutMs: 5000, dispatcher: pool }).catch(
      (e) => e,
    );
    expect(err).toBeInstanceOf(ControlTransportError);
    expect(err.reason).toBe('connect');
    expect(err.code).toBe('ECONNREFUSED');
    expect(err.isConnectionError).toBe(true);
    expect(JSON.parse(JSON.stringify(err)).reason).toBe('connect');
  });

  it('a control pool has a configurable number of connections per origin', async () => {
    let active = 0;
    let peak = 0;
    const url = await server((app) => {
      app.get('/slow', async () => {
        active++;
        peak = Math.max(peak, active);
        await sleep(50);
        active--;
        return {};
      });
    });
    for (const [connections, expected] of [
      [1, 1],
      [4, 3],
    ]) {
      const sized = createControlPool({ connections });
      peak = 0;
      await Promise.all([1, 2, 3].map(() => controlCall({ url, method: 'GET', path: '/slow', token: 't', timeoutMs: 5000, dispatcher: sized })));
      expect(peak).toBe(expected);
      await sized.close();
    }
  });
});

describe('helpers', () => {
  it('callTimeoutMs = max(deadline − now, 0) + 5 s', () => {
    expect(callTimeoutMs(100, 90_000)).toBe(15_000);
    expect(callTimeoutMs(100, 200_000)).toBe(5_000);
  });
  it('joinUrl', () => {
    expect(joinUrl('http://h:1/', '/a')).toBe('http://h:1/a');
    expect(joinUrl('http://h:1/p', 'a')).toBe('http://h:1/p/a');
  });
});
