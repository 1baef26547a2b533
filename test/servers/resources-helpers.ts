// Shared helpers of the resources server tests: a ServerContext without a launcher, a cookie-
// keeping client over `inject`, and control calls with the bearer token.
import type { FastifyInstance } from 'fastify';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import type { Deployment, ServerEntry } from '../../servers/common/deployment.js';
import type { ServerContext, ServerModule } from '../../servers/common/server-context.js';
import { cookieHeader, parseSetCookies } from '../../servers/common/session-cookie.js';
import { sleep } from '../helpers/wait.js';

export const TOKEN = 'resources-test-token';
export const SECRET = 'resources-test-session-secret';

export function contextFor(name: string, type: string, opts: { checkpoint?: boolean } = {}): ServerContext {
  const checkpoint =
    opts.checkpoint === false
      ? { enabled: false, control_auth_token: null, lease_grace_seconds: 600 }
      : { enabled: true, control_auth_token: TOKEN, lease_grace_seconds: 600 };
  const entry: ServerEntry = { kind: 'resources', type, port: 0, options: {}, workers: 1 };
  const deployment = { checkpoint, servers: { [name]: entry } } as Deployment;
  return { name, entry, deployment, endpoints: {}, checkpoint, sessionSecret: SECRET, logLevel: 'silent' };
}

export async function buildServer<O>(
  mod: { default: ServerModule<O> },
  name: string,
  type: string,
  options: Record<string, unknown> = {},
  opts: { checkpoint?: boolean } = {},
): Promise<FastifyInstance> {
  const m = mod.default;
  return m.build(contextFor(name, type, opts), m.optionsSchema.parse(options));
}

export interface Reply {
  status: number;
  headers: Record<string, unknown>;
  body: any;
}

/** One caller of the data plane: keeps the cookies the server sets, like the environment does. */
export class Client {
  cookies: Record<string, string> = {};

  constructor(private readonly app: FastifyInstance) {}

  async post(path: string, body: unknown = {}, headers: Record<string, string> = {}): Promise<Reply> {
    const cookie = cookieHeader(this.cookies);
    const res = await this.app.inject({
      method: 'POST',
      url: path,
      headers: { 'content-type': 'application/json', ...(cookie ? { cookie } : {}), ...headers },
      payload: JSON.stringify(body),
    });
    Object.assign(this.cookies, parseSetCookies(res.headers['set-cookie'] as string | string[] | undefined));
    return { status: res.statusCode, headers: res.headers, body: parse(res.body) };
  }
}

export async function control(app: FastifyInstance, op: string, body?: Record<string, unknown>): Promise<Reply> {
  const res = await app.inject({
    method: op === 'status' ? 'GET' : 'POST',
    url: `${CONTROL_PREFIX}/${op}`,
    headers: { authorization: `Bearer ${TOKEN}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    payload: body ? JSON.stringify(body) : undefined,
  });
  return { status: res.statusCode, headers: res.headers, body: parse(res.body) };
}

export const soon = (s = 5): number => Date.now() / 1000 + s;
export const ep = (rollout_id: string, attempt = 0) => ({ rollout_id, attempt });

/** True when `p` settled within `ms`. */
export async function settlesWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  let done = false;
  void p.then(
    () => (done = true),
    () => (done = true),
  );
  await sleep(ms);
  return done;
}

function parse(text: string): any {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
