// Posts a generation-cut inventory to the backend (participants.md §5.6) on a connection pool of its
// own (held generation calls may occupy every data connection to the backend), bearer-authorized
// with the control token, bounded by the time the caller grants; the receipt is checked strictly.
import { Agent, request } from 'undici';
import { CLIENT_KEEP_ALIVE } from '../../protocol/keep-alive.js';
import { GENERATION_CUT_PATH, validateReceipt, type CutOutcome, type GenerationCutInventory } from './cut-wire.js';

let pool: Agent | undefined;

function cutPool(): Agent {
  pool ??= new Agent({ connections: 4, headersTimeout: 0, bodyTimeout: 0, connect: { timeout: 10_000 }, ...CLIENT_KEEP_ALIVE });
  return pool;
}

export async function closeCutPool(): Promise<void> {
  const p = pool;
  pool = undefined;
  await p?.close();
}

export interface PostInventoryOptions {
  backendRoot: string;
  token: string | undefined;
  inventory: GenerationCutInventory;
  timeoutMs: number;
  signal?: AbortSignal;
}

/** One outcome per inventory ticket; throws on any transport, HTTP or receipt failure. */
export async function postInventory(opts: PostInventoryOptions): Promise<CutOutcome[]> {
  const signals = [AbortSignal.timeout(Math.max(1, Math.floor(opts.timeoutMs)))];
  if (opts.signal) signals.push(opts.signal);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  const res = await request(`${opts.backendRoot.replace(/\/+$/, '')}${GENERATION_CUT_PATH}`, {
    method: 'POST',
    headers,
    body: JSON.stringify(opts.inventory),
    signal: AbortSignal.any(signals),
    dispatcher: cutPool(),
  });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`generation-cut service answered HTTP ${res.statusCode}: ${text.slice(0, 300)}`);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new Error('generation-cut receipt is not JSON');
  }
  return validateReceipt(opts.inventory, body);
}
