// The worker's JSON log lines (pino's field names, the SDK's metadata flattened, the run's fields
// from our workflow IDs), the one Runtime per process (installed once, a second different ask
// refused clearly), and the worker's usage errors for the two options. Its own process (vitest
// forks), so installing a Runtime here is fine.
import { ApplicationFailure } from '@temporalio/common';
import { type LogEntry, Runtime } from '@temporalio/worker';
import { describe, expect, it } from 'vitest';
import { freePort } from '../../scripts/temporal-dev.mjs';
import { installWorkerRuntime, JsonLogger, logRecord, toJson } from '../../worker-telemetry.js';
import { runCommand } from '../helpers/cli.js';

const NANOS = 1_700_000_000_123_456_789n;
const entry = (meta: Record<string, unknown>, level: LogEntry['level'] = 'INFO'): LogEntry => ({ level, message: 'hello', timestampNanos: NANOS, meta });

describe('JSON log lines', () => {
  it("have pino's level number, time in epoch ms, msg last, component and the metadata flattened", () => {
    const r = logRecord(entry({ sdkComponent: 'worker', taskQueue: 'q', state: 'RUNNING' }, 'WARN'));
    expect(r).toEqual({ level: 40, time: 1_700_000_000_123, component: 'worker', sdkComponent: 'worker', taskQueue: 'q', state: 'RUNNING', msg: 'hello' });
    expect(Object.keys(r).slice(0, 3)).toEqual(['level', 'time', 'component']);
    expect(Object.keys(r).at(-1)).toBe('msg');
    expect(['TRACE', 'DEBUG', 'INFO', 'ERROR'].map((l) => logRecord(entry({}, l as LogEntry['level'])).level)).toEqual([10, 20, 30, 50]);
  });

  it('name the run from our workflow IDs, and the checkpoint ID or capture key of an attempt', () => {
    const wf = (workflowType: string, workflowId: string) => logRecord(entry({ sdkComponent: 'workflow', workflowType, workflowId, runId: 'r' }));
    expect(wf('trainingRun', 'my-run')).toMatchObject({ run: 'my-run' });
    expect(wf('rolloutShard', 'my-run/shard/3')).toMatchObject({ run: 'my-run' });
    expect(wf('checkpointAttempt', 'my-run/checkpoint/rollout-step-2-snapshot-1-ab')).toMatchObject({
      run: 'my-run',
      checkpoint_id: 'rollout-step-2-snapshot-1-ab',
    });
    expect(wf('rolloutAttempt', 'my-run/rollout/my-run.p4.g1-a2')).toMatchObject({ run: 'my-run', capture_key: 'my-run.p4.g1-a2' });
    // Another workflow type's ID says nothing about a run.
    expect(wf('somethingElse', 'a/b')).not.toHaveProperty('run');
    // Activities: their workflow's ID and type; the task token is left out.
    const act = logRecord(
      entry({ sdkComponent: 'activity', activityType: 'gymPrepare', taskToken: 'AAAA', workflowId: 'my-run/checkpoint/c1', workflowType: 'checkpointAttempt' }),
    );
    expect(act).toMatchObject({ activityType: 'gymPrepare', run: 'my-run', checkpoint_id: 'c1' });
    expect(act).not.toHaveProperty('taskToken');
    // A log call's own fields take the format's names and are not overwritten.
    expect(logRecord(entry({ checkpointId: 'restore-1', captureKey: 'k-a1', workflowType: 'trainingRun', workflowId: 'r1' }))).toMatchObject({
      checkpoint_id: 'restore-1',
      capture_key: 'k-a1',
      run: 'r1',
    });
    // Fields named like the format's own keep theirs.
    expect(logRecord(entry({ msg: 'x', level: 'y' }))).toMatchObject({ msg: 'hello', level: 30, meta_msg: 'x', meta_level: 'y' });
  });

  it("serialize errors as pino's {type, message, stack} with their cause, bigints as strings, cycles cut", () => {
    const cause = new TypeError('inner');
    const err = new Error('outer', { cause });
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = cyclic;
    const out = JSON.parse(toJson({ err, n: 5n, cyclic })) as Record<string, any>;
    expect(out.err).toMatchObject({ type: 'Error', message: 'outer', cause: { type: 'TypeError', message: 'inner' } });
    expect(out.err.stack).toContain('outer');
    expect(out.n).toBe('5');
    expect(out.cyclic).toEqual({ a: 1, self: '[Circular]' });
    const failure = JSON.parse(toJson(ApplicationFailure.nonRetryable('refused', 'unauthorized'))) as Record<string, unknown>;
    expect(failure).toMatchObject({ type: 'ApplicationFailure', message: 'refused', failureType: 'unauthorized', nonRetryable: true });
  });

  it('JsonLogger writes one JSON object per line, filtered by level', () => {
    const written: string[] = [];
    const logger = new JsonLogger('INFO', (line) => written.push(line));
    logger.debug('not shown');
    logger.info('line\nwith a break', { workflowType: 'rolloutShard', workflowId: 'r/shard/0', error: new Error('boom') });
    expect(written).toHaveLength(1);
    expect(written[0]!.endsWith('\n')).toBe(true);
    expect(written[0]!.slice(0, -1)).not.toContain('\n');
    expect(JSON.parse(written[0]!)).toMatchObject({
      level: 30,
      component: 'worker',
      run: 'r',
      msg: 'line\nwith a break',
      error: { type: 'Error', message: 'boom' },
    });
  });
});

describe('the Runtime', () => {
  it('is installed once with the metrics endpoint and the JSON logger; a different ask later is refused', async () => {
    expect(Runtime._instance).toBeUndefined();
    installWorkerRuntime({}); // nothing asked: the SDK's default, created on the first connection
    expect(Runtime._instance).toBeUndefined();
    const address = `127.0.0.1:${await freePort()}`;
    installWorkerRuntime({ metricsAddress: address, logFormat: 'json' });
    expect(Runtime._instance).toBeDefined();
    expect(Runtime.defaultOptions.logger).toBeInstanceOf(JsonLogger);
    // The same ask again (a second set of workers in the process) keeps it.
    installWorkerRuntime({ metricsAddress: address, logFormat: 'json' });
    installWorkerRuntime({ logFormat: 'text' });
    const res = await fetch(`http://${address}/metrics`);
    expect(res.status).toBe(200);
    const other = `127.0.0.1:${await freePort()}`;
    expect(() => installWorkerRuntime({ metricsAddress: other })).toThrow(
      `worker: this process's Temporal Runtime already exists without metrics on ${other} (it has ${address}); the SDK installs one Runtime per process`,
    );
  });
});

describe('worker usage errors', () => {
  it('a bad --log-format or --metrics-address exits 2 with one line and the usage', async () => {
    const env = { ...process.env, GYM_CONTROL_TOKEN: 't' };
    const [format, address, host] = await Promise.all([
      runCommand('worker.ts', ['--log-format', 'xml'], { env }),
      runCommand('worker.ts', ['--metrics-address', '9464'], { env }),
      runCommand('worker.ts', [], { env: { ...env, WORKER_METRICS_ADDRESS: 'localhost:9464' } }),
    ]);
    expect(format.code).toBe(2);
    expect(format.stderr.split('\n')[0]).toBe("worker: --log-format must be json or text, not 'xml'");
    expect(address.code).toBe(2);
    expect(address.stderr.split('\n')[0]).toBe("worker: --metrics-address must be an IP address and a port (e.g. 127.0.0.1:9464 or [::]:9464), not '9464'");
    expect(host.code).toBe(2);
    expect(host.stderr.split('\n')[0]).toMatch(/not 'localhost:9464'$/);
    for (const r of [format, address, host]) expect(r.stderr.split('\n')[1]).toMatch(/^usage: npm run worker -- /);
  }, 120_000);
});
