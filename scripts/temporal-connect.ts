// Reaching the Temporal frontend within a bound, or failing with a sentence that names the address,
// where it came from and why: the connection of every CLI (run, report).
import { connect as tcpConnect } from 'node:net';
import type { Connection } from '@temporalio/client';

export interface Target {
  address: string;
  /** Where the address came from, for messages. */
  source: string;
}

export class ConnectFailure extends Error {}

export const DEFAULT_ADDRESS = '127.0.0.1:7233';

/** The connection flags every CLI that talks to Temporal takes (scripts/cli.mjs flag specs). */
export const CONNECTION_FLAGS = {
  address: { type: 'string', value: 'HOST:PORT', help: `the Temporal frontend (default: $TEMPORAL_ADDRESS, else ${DEFAULT_ADDRESS})` },
  namespace: { type: 'string', value: 'NS', help: 'the Temporal namespace (default: default)' },
  'connect-timeout-s': { type: 'string', value: 'N', help: 'give up reaching the Temporal server after N seconds (default: 2)' },
} as const;

export const CONNECTION_ENV = { name: 'TEMPORAL_ADDRESS', help: 'the Temporal frontend, when --address is not given' };

const oneLine = (s: string): string => s.replace(/\s*\n\s*/g, ' ').trim();

/** The frontend from --address, else TEMPORAL_ADDRESS, else the default. */
export function targetOf(address: string | undefined, env: NodeJS.ProcessEnv, fallback = DEFAULT_ADDRESS): Target {
  if (address) return { address, source: '--address' };
  if (env.TEMPORAL_ADDRESS) return { address: env.TEMPORAL_ADDRESS, source: 'TEMPORAL_ADDRESS' };
  return { address: fallback, source: 'the default; set --address or TEMPORAL_ADDRESS' };
}

/** Why nothing answers at host:port, from a plain TCP connection; undefined if it connects (or the address is not host:port). */
function tcpProblem(address: string, timeoutMs: number): Promise<string | undefined> {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(address) ?? /^([^:/]+):(\d+)$/.exec(address);
  if (!m) return Promise.resolve(undefined);
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: m[1]!, port: Number(m[2]) });
    const done = (why: string | undefined): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(why);
    };
    const timer = setTimeout(() => done(`no answer within ${timeoutMs / 1000} s`), timeoutMs);
    socket.once('connect', () => done(undefined));
    socket.once('error', (err: NodeJS.ErrnoException) => {
      const code = err.code ?? (err as { errors?: NodeJS.ErrnoException[] }).errors?.[0]?.code;
      if (code === 'ECONNREFUSED') done('connection refused');
      else if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') done(`cannot resolve host ${m[1]}`);
      else if (code === 'EHOSTUNREACH' || code === 'ENETUNREACH') done('host unreachable');
      else done(oneLine(err.message));
    });
  });
}

/** Connects within timeoutMs, or throws a ConnectFailure naming the address, its source, and why. */
export async function connectWithin(target: Target, timeoutMs: number): Promise<Connection> {
  // Alongside the connection, not after it: gRPC only says that the deadline passed.
  const problem = tcpProblem(target.address, timeoutMs);
  // Loaded here, not at the top: a CLI's --help and usage errors answer without the Temporal client.
  const { Connection } = await import('@temporalio/client');
  try {
    return await Connection.connect({ address: target.address, connectTimeout: timeoutMs });
  } catch (err) {
    const why = (await problem) ?? `it accepts connections but gave no Temporal answer within ${timeoutMs / 1000} s (${oneLine((err as Error).message)})`;
    throw new ConnectFailure(`cannot reach the Temporal server at ${target.address} (${target.source}): ${why}`);
  }
}
