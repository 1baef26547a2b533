// The checkpoint control routes as one Fastify plugin, mounted by every participant kind
// (control-plane.md §3). Bearer check first, closed bodies validated at the edge (422 with a
// `detail` array), typed refusals as the error envelope, anything untyped as a plain 500.
import { timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { CONTROL_PREFIX, REQUEST_SCHEMAS } from '../../protocol/control.js';
import { isProtocolError, refuse } from '../../protocol/errors.js';
import { sendRefusal } from '../common/metrics.js';
import { annotateRequestSpan } from '../common/tracing.js';
import { placeHeldPart } from './storage/held-part.js';
import { workerRole } from './storage/worker-role.js';
import type {
  CheckpointRequest,
  CommitReply,
  CommitRequest,
  ForgetReply,
  ForgetRequest,
  PrepareReply,
  PrepareRequest,
  RenewReply,
  RestoreReply,
  RestoreRequest,
  ResumeReply,
  RetireReply,
  RetireRequest,
  StatusReply,
} from '../../protocol/control.js';

/** What the control routes serve: one participant's plane, or a multi-worker server's coordinator (servers/workers). */
export interface ControlSurface {
  status(): StatusReply | Promise<StatusReply>;
  prepare(req: PrepareRequest): Promise<PrepareReply>;
  renew(req: CheckpointRequest): Promise<RenewReply>;
  commit(req: CommitRequest): Promise<CommitReply>;
  restore(req: RestoreRequest): Promise<RestoreReply>;
  resume(req: CheckpointRequest): Promise<ResumeReply>;
  retire(req: RetireRequest): Promise<RetireReply>;
  forget(req: ForgetRequest): Promise<ForgetReply>;
  close(): void | Promise<void>;
}

export interface ControlPluginOptions {
  plane: ControlSurface;
  /** The bearer token; the routes refuse to start with an empty one (§3.2). */
  token: string;
  /** Largest accepted body (a restore scope of 16,000 episodes is about 1 MB). */
  bodyLimit?: number;
}

/** Constant-time comparison of the whole header value with `Bearer <token>`. */
export function bearerMatches(header: string | undefined, token: string): boolean {
  if (header === undefined) return false;
  const got = Buffer.from(header, 'utf8');
  const want = Buffer.from(`Bearer ${token}`, 'utf8');
  return got.length === want.length && timingSafeEqual(got, want);
}

/** The framework-native validation shape (§3.4): status 422, `{"detail": [...]}`. */
export class RequestValidationError extends Error {
  constructor(readonly detail: Array<{ type: string; loc: Array<string | number>; msg: string; input?: unknown }>) {
    super('request validation failed');
  }
}

function zodDetail(error: z.ZodError): RequestValidationError {
  return new RequestValidationError(
    error.issues.map((i) => ({
      type: i.code,
      loc: ['body', ...i.path.map((p) => (typeof p === 'symbol' ? String(p) : p))],
      msg: i.message,
    })),
  );
}

/**
 * A worker of a multi-worker server only: its front has it write its held records part into the
 * join's file (storage/held-part.ts). Not a protocol operation: the front answers this path 404
 * to anyone else, as it does every control path it does not serve.
 */
export const PLACE_PART_OPERATION = 'place-part';
const PlacePartSchema = z.object({ checkpoint_id: z.string().min(1), file: z.string().min(1), offset: z.number().int().nonnegative() }).strict();

const POST_OPERATIONS = ['prepare', 'renew', 'commit', 'restore', 'resume', 'retire', 'forget'] as const;
type PostOperation = (typeof POST_OPERATIONS)[number];
const OTHER_METHODS = ['PUT', 'PATCH', 'DELETE'] as const;

export const controlPlugin: FastifyPluginAsync<ControlPluginOptions> = async (app: FastifyInstance, opts) => {
  if (!opts.token) throw new Error('checkpoint control routes need a non-empty control_auth_token');
  const { plane, token } = opts;

  // Bodies are parsed here, after the bearer check, so a malformed body never beats a 401 and
  // never becomes a 400/500 from the framework's parser.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'string', bodyLimit: opts.bodyLimit ?? 64 * 1024 * 1024 }, (_req, body, done) => {
    done(null, body);
  });

  app.addHook('onRequest', async (req) => {
    if (!bearerMatches(req.headers.authorization, token)) {
      throw refuse('unauthorized', 'missing or wrong bearer token');
    }
  });

  app.setErrorHandler((err: unknown, req: FastifyRequest, reply: FastifyReply) => {
    if (isProtocolError(err)) return sendRefusal(reply, err);
    if (err instanceof RequestValidationError) return reply.code(422).send({ detail: err.detail });
    const e = err as { statusCode?: number; code?: string; message?: string };
    if (e.statusCode && e.statusCode >= 400 && e.statusCode < 500) {
      // Framework refusals (body too large, bad content length): still a typed 4xx.
      return reply.code(e.statusCode === 413 ? 413 : 422).send({ detail: [{ type: e.code ?? 'invalid', loc: ['body'], msg: e.message ?? 'invalid request' }] });
    }
    req.log.error({ err }, 'control route failed');
    return reply.code(500).type('text/plain').send('Internal Server Error');
  });

  app.get('/status', async () => plane.status());

  for (const op of POST_OPERATIONS) {
    app.post(`/${op}`, async (req) => {
      const body = parseBody(op, req.body);
      annotateRequestSpan(req, { checkpoint_id: (body as { checkpoint_id: string }).checkpoint_id });
      switch (op) {
        case 'prepare':
          return plane.prepare(body as never);
        case 'renew':
          return plane.renew(body as never);
        case 'commit':
          return plane.commit(body as never);
        case 'restore':
          return plane.restore(body as never);
        case 'resume':
          return plane.resume(body as never);
        case 'retire':
          return plane.retire(body as never);
        case 'forget':
          return plane.forget(body as never);
      }
    });
    app.route({ method: [...OTHER_METHODS, 'GET'], url: `/${op}`, handler: methodNotAllowed });
  }
  app.route({ method: [...OTHER_METHODS, 'POST'], url: '/status', handler: methodNotAllowed });

  if (workerRole() !== undefined) {
    app.post(`/${PLACE_PART_OPERATION}`, async (req) => {
      const body = parseWith(PlacePartSchema, req.body);
      return placeHeldPart(body.checkpoint_id, body.file, body.offset);
    });
  }
};

async function methodNotAllowed(_req: FastifyRequest, reply: FastifyReply): Promise<void> {
  await reply.code(405).send({ detail: 'Method Not Allowed' });
}

function parseBody(op: PostOperation, raw: unknown): unknown {
  return parseWith(REQUEST_SCHEMAS[op], raw);
}

function parseWith<T>(schema: z.ZodType<T>, raw: unknown): T {
  let json: unknown;
  if (typeof raw !== 'string' || raw.length === 0) {
    throw new RequestValidationError([{ type: 'missing', loc: ['body'], msg: 'Field required' }]);
  }
  try {
    json = JSON.parse(raw);
  } catch (err) {
    throw new RequestValidationError([{ type: 'json_invalid', loc: ['body'], msg: `JSON decode error: ${(err as Error).message}` }]);
  }
  const result = schema.safeParse(json);
  if (!result.success) throw zodDetail(result.error);
  return result.data;
}

/** Mounts the control routes under their prefix on a server's app. */
export async function mountControlPlane(app: FastifyInstance, opts: ControlPluginOptions): Promise<void> {
  await app.register(controlPlugin, { ...opts, prefix: CONTROL_PREFIX });
  app.addHook('onClose', async () => opts.plane.close());
}
