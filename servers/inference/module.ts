// The `inference` server kind (type `tiny_policy`): the tabular policy behind an OpenAI-compatible
// API. Not a checkpoint participant: it stands outside Gym and survives a Gym crash.
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { ConfigError } from '../common/config-error.js';
import type { ServerModule } from '../common/server-context.js';
import { buildInferenceApp } from './app.js';
import { PolicyWeightsSchema, type PolicyWeights } from './policy.js';

export const InferenceOptionsSchema = z.strictObject({
  /** Mixed into every sampling seed (`<seed>:<rollout>:<call>:<version>`); absent → the documented seed. */
  seed: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
  /** Delay before each generated token (both plain and streamed replies); makes generations long enough to cut. */
  token_delay_ms: z.number().min(0).max(60_000).default(0),
  /** Start from these weights (JSON `{version, logits}`) instead of the initial ones. */
  policy_file: z.string().min(1).optional(),
});
export type InferenceOptions = z.infer<typeof InferenceOptionsSchema>;

export function loadPolicyFile(file: string, key: string): PolicyWeights {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(key, `cannot read policy weights from ${file}: ${(err as Error).message}`);
  }
  const r = PolicyWeightsSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw new ConfigError(key, `${file}: ${[...issue.path.map(String), issue.message].join(': ')}`);
  }
  return r.data;
}

const inference: ServerModule<InferenceOptions> = {
  optionsSchema: InferenceOptionsSchema,
  async build(ctx, options) {
    const weights = options.policy_file ? loadPolicyFile(options.policy_file, `servers.${ctx.name}.options.policy_file`) : undefined;
    const { app } = await buildInferenceApp({
      name: ctx.name,
      logLevel: ctx.logLevel,
      salt: options.seed,
      tokenDelayMs: options.token_delay_ms,
      weights,
      // The cut service answers the policy model server with the deployment's control token.
      ...(ctx.checkpoint?.enabled && ctx.checkpoint.control_auth_token ? { controlToken: ctx.checkpoint.control_auth_token } : {}),
    });
    return app;
  },
};

export default inference;
