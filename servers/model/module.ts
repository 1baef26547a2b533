// The policy model server (kind `model`, type `policy_model`): an OpenAI-compatible front of one
// backend — ours (`backend`: an inference server of the deployment) or any OpenAI-compatible server
// (`backend_url`; backend.ts). With `checkpoint_policy` (and the global `checkpoint.enabled`) it is
// the checkpoint participant of kind `model` (participant.ts): admission gate, held responses,
// capture ledger and token store, generation cuts. Otherwise every call passes the open gate.
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { createGymApp } from '../common/app.js';
import { mountParticipant, peerUrl, type ServerContext, type ServerModule } from '../common/server-context.js';
import { registerCaptureRoutes } from './capture-routes.js';
import { closeCutPool } from './cut-client.js';
import { OPEN_GATE } from './gate.js';
import { ModelParticipant } from './participant.js';
import { closeThirdPartyPool, resolveBackend } from './backend.js';
import { registerModelProxy } from './proxy.js';

export const PolicyModelOptionsSchema = z
  .strictObject({
    /** Name of the inference server in this deployment. */
    backend: z.string().min(1).optional(),
    /** Or the URL of any OpenAI-compatible backend (a trailing `/v1` is allowed). */
    backend_url: z.url({ protocol: /^https?$/ }).optional(),
    /**
     * `ng` (default): our backend, which reads our request extensions; `openai`: a third-party
     * OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API), which gets plain OpenAI calls.
     */
    backend_api: z.enum(['ng', 'openai']).optional(),
    /** Name of the environment variable holding the backend's API key (sent as a bearer token). */
    api_key_env: z
      .string()
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name')
      .optional(),
    /** The backend's name of the model (the request's `model`); required with `backend_api: openai`. */
    served_model: z.string().min(1).optional(),
    /** Fields merged into every generation request to a third-party backend (e.g. `{return_token_ids: true}` for vLLM). */
    extra_body: z.record(z.string(), z.unknown()).optional(),
    /** Bound on the backend's answer and on each streamed chunk; null: none. Default: none for ours, 600 for openai. */
    request_timeout_s: z.number().positive().finite().nullable().optional(),
    /** Be the checkpoint participant of kind `model` (only with the global checkpoint.enabled). */
    checkpoint_policy: z.boolean().default(false),
    /** Cut generations still running at prepare (§5.6); needs checkpoint_policy. */
    checkpoint_generation_cuts: z.boolean().default(false),
    /**
     * Where the capture ledger and the token store live (servers/model/token-store.ts). Default:
     * `<run dir>/capture/<server name>` when started by the launcher, else a directory under the
     * system temp dir named after the server.
     */
    capture_dir: z.string().min(1).optional(),
  })
  .superRefine((o, ctx) => {
    if ((o.backend === undefined) === (o.backend_url === undefined)) {
      ctx.addIssue({ code: 'custom', path: ['backend'], message: 'set exactly one of backend (an inference server name) and backend_url' });
    }
    if (o.checkpoint_generation_cuts && !o.checkpoint_policy) {
      ctx.addIssue({ code: 'custom', path: ['checkpoint_generation_cuts'], message: 'requires checkpoint_policy: true' });
    }
    const api = o.backend_api ?? 'ng';
    if (o.checkpoint_generation_cuts && api !== 'ng') {
      ctx.addIssue({
        code: 'custom',
        path: ['checkpoint_generation_cuts'],
        message: 'needs a backend that continues a generation from a token prefix (backend_api: ng); an OpenAI-compatible server cannot',
      });
    }
    if (api === 'openai' && o.served_model === undefined) {
      ctx.addIssue({ code: 'custom', path: ['served_model'], message: "required with backend_api: openai (the backend's name of the model)" });
    }
    if (api === 'ng' && o.extra_body !== undefined) {
      ctx.addIssue({ code: 'custom', path: ['extra_body'], message: 'only for backend_api: openai' });
    }
  });
export type PolicyModelOptions = z.infer<typeof PolicyModelOptionsSchema>;

/**
 * The capture directory: the option, else beside the launcher's `endpoints.json` (the run dir,
 * read from this process's `--endpoints` argument), else under the temp dir.
 */
export function captureDirOf(ctx: ServerContext, options: PolicyModelOptions, argv: readonly string[] = process.argv): string {
  if (options.capture_dir) return resolve(options.capture_dir);
  const i = argv.indexOf('--endpoints');
  const endpoints = i >= 0 ? argv[i + 1] : undefined;
  if (endpoints) return join(dirname(resolve(endpoints)), 'capture', ctx.name);
  return join(tmpdir(), 'gym-capture', ctx.name);
}

/** A checkpoint participant only with `checkpoint_policy` (and the deployment's checkpoint block enabled). */
function isPolicyParticipant(ctx: Pick<ServerContext, 'checkpoint'>, options: PolicyModelOptions): boolean {
  return ctx.checkpoint.enabled && options.checkpoint_policy;
}

export interface PolicyModelServer {
  app: FastifyInstance;
  /** Undefined unless checkpoint_policy and checkpoint.enabled. */
  participant: ModelParticipant | undefined;
}

export async function buildPolicyModel(ctx: ServerContext, options: PolicyModelOptions): Promise<PolicyModelServer> {
  const url = options.backend !== undefined ? peerUrl(ctx, options.backend, 'backend', 'inference') : options.backend_url!;
  const backend = resolveBackend({
    api: options.backend_api ?? 'ng',
    url,
    apiKeyEnv: options.api_key_env,
    servedModel: options.served_model,
    extraBody: options.extra_body,
    requestTimeoutS: options.request_timeout_s,
    configKey: `servers.${ctx.name}.options`,
  });
  const app = createGymApp({ name: ctx.name, kind: 'model', logLevel: ctx.logLevel });
  app.addHook('onClose', async () => closeThirdPartyPool());
  if (!isPolicyParticipant(ctx, options)) {
    registerModelProxy(app, { backend, gate: OPEN_GATE });
    return { app, participant: undefined };
  }
  const participant = await ModelParticipant.create({
    serverName: ctx.name,
    captureDir: captureDirOf(ctx, options),
    generationCuts: options.checkpoint_generation_cuts,
    backendApi: backend.api,
    backendRoot: backend.root,
    controlToken: ctx.checkpoint.control_auth_token ?? undefined,
    log: (msg, err) => app.log.warn({ err }, msg),
  });
  // The cut round gets half the remaining prepare time; the hooks do not see the request, so the
  // prepare body's deadline is noted on its way in (added before the control routes exist).
  app.addHook('preHandler', async (req) => {
    if (req.method !== 'POST' || req.routeOptions.url !== `${CONTROL_PREFIX}/prepare` || typeof req.body !== 'string') return;
    try {
      const b = JSON.parse(req.body) as { checkpoint_id?: unknown; deadline_ts?: unknown };
      const deadline = typeof b.deadline_ts === 'string' ? Number(b.deadline_ts) : b.deadline_ts;
      if (typeof b.checkpoint_id === 'string' && typeof deadline === 'number' && Number.isFinite(deadline)) participant.notePrepare(b.checkpoint_id, deadline);
    } catch {
      /* the control route answers the malformed body */
    }
  });
  registerModelProxy(app, { backend, gate: participant });
  const plane = await mountParticipant(app, ctx, participant.hooks);
  if (plane) participant.attach(plane);
  registerCaptureRoutes(app, { participant, token: ctx.checkpoint.control_auth_token ?? '', isRetired: (e) => plane?.isRetired(e) ?? false });
  app.addHook('onClose', async () => closeCutPool());
  return { app, participant };
}

const policyModel: ServerModule<PolicyModelOptions> = {
  optionsSchema: PolicyModelOptionsSchema,
  participates: isPolicyParticipant,
  async build(ctx: ServerContext, options: PolicyModelOptions) {
    return (await buildPolicyModel(ctx, options)).app;
  },
};

export default policyModel;
