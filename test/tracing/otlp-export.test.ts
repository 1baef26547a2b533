// The production path of servers/common/tracing.ts: with an OTLP endpoint (no test exporter), spans
// are batched and POSTed to `<endpoint>/v1/traces`; here a local HTTP server on 127.0.0.1 stands in
// for the collector. Also the endpoint's validation, shared by the worker's flag and the servers' variable.
import { createServer, type IncomingMessage } from 'node:http';
import { trace } from '@opentelemetry/api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { otlpTracesUrl, startTracing, tracingOn } from '../../servers/common/tracing.js';

const received: Array<{ method: string; url: string; contentType: string; body: string }> = [];
const collector = createServer((req: IncomingMessage, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    received.push({
      method: req.method ?? '',
      url: req.url ?? '',
      contentType: String(req.headers['content-type']),
      body: Buffer.concat(chunks).toString('utf8'),
    });
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  });
});
let endpoint = '';

beforeAll(async () => {
  await new Promise<void>((resolve) => collector.listen(0, '127.0.0.1', resolve));
  endpoint = `http://127.0.0.1:${(collector.address() as { port: number }).port}`;
});
afterAll(async () => {
  await new Promise((resolve) => collector.close(resolve));
});

describe('OTLP export', () => {
  it('the endpoint is a base URL (the traces path appended once) and must be http(s)', () => {
    expect(otlpTracesUrl('http://127.0.0.1:4318')).toBe('http://127.0.0.1:4318/v1/traces');
    expect(otlpTracesUrl('http://collector:4318/')).toBe('http://collector:4318/v1/traces');
    expect(otlpTracesUrl('https://collector/otlp/v1/traces')).toBe('https://collector/otlp/v1/traces');
    expect(() => otlpTracesUrl('127.0.0.1:4318')).toThrow(/http\(s\) URL/);
    expect(() => otlpTracesUrl('grpc://127.0.0.1:4317')).toThrow(/http\(s\) URL/);
  });

  it('nothing configured: tracing stays off', async () => {
    expect(await startTracing({ serviceName: 'off', otlpEndpoint: ' ' })).toBeUndefined();
    expect(tracingOn()).toBe(false);
  });

  it('spans reach <endpoint>/v1/traces with the service name; shutdown turns tracing off again', async () => {
    const tracing = (await startTracing({ serviceName: 'weather_env', otlpEndpoint: endpoint, resourceAttributes: { 'gym.kind': 'environment' } }))!;
    expect(tracingOn()).toBe(true);
    await expect(startTracing({ serviceName: 'again', otlpEndpoint: endpoint })).rejects.toThrow(/already on/);
    trace.getTracer('test').startSpan('gym.control.commit').end();
    await tracing.shutdown();
    expect(tracingOn()).toBe(false);
    expect(received).toHaveLength(1);
    expect(received[0]).toMatchObject({ method: 'POST', url: '/v1/traces' });
    expect(received[0]!.body).toContain('gym.control.commit');
    expect(received[0]!.body).toContain('weather_env');
  });
});
