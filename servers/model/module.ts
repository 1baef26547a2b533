// The policy model server (kind `model`, type `policy_model`): an OpenAI-compatible front of one
// inference backend. With `checkpoint_policy` it will become the model participant (admission
// gate, held responses, capture ledger; participants.md §5); today the gate is always open.
import { z } from 'zod';
import { createGymApp } from '../common/app.js';
import { peerUrl, type ServerContext, type ServerModule } from '../common/server-context.js';
import { OPEN_GATE } from './gate.js';
import { backendRootOf, registerModelProxy } from './proxy.js';

export const PolicyModelOptionsSchema = z
  .strictObject({
    /** Name of the inference server in this deployment. */
    backend: z.string().min(1).optional(),
    /** Or the URL of any OpenAI-compatible backend (a trailing `/v1` is allowed). */
    backend_url: z.url({ protocol: /^https?$/ }).optional(),
    /** Be the checkpoint participant of kind `model` (only with the global checkpoint.enabled). */
    checkpoint_policy: z.boolean().default(false),
    /** Cut generations still running at prepare (§5.6); needs checkpoint_policy. */
    checkpoint_generation_cuts: z.boolean().default(false),
  })
  .superRefine((o, ctx) => {
    if ((o.backend === undefined) === (o.backend_url === undefined)) {
      ctx.addIssue({ code: 'custom', path: ['backend'], message: 'set exactly one of backend (an inference server name) and backend_url' });
    }
    if (o.checkpoint_generation_cuts && !o.checkpoint_policy) {
      ctx.addIssue({ code: 'custom', path: ['checkpoint_generation_cuts'], message: 'requires checkpoint_policy: true' });
    }
  });
export type PolicyModelOptions = z.infer<typeof PolicyModelOptionsSchema>;

const policyModel: ServerModule<PolicyModelOptions> = {
  optionsSchema: PolicyModelOptionsSchema,
  async build(ctx: ServerContext, options: PolicyModelOptions) {
    const backend = options.backend !== undefined ? peerUrl(ctx, options.backend, 'backend', 'inference') : options.backend_url!;
    const app = createGymApp({ name: ctx.name, kind: 'model', logLevel: ctx.logLevel });
    // Seam: with checkpoint_policy (and checkpoint.enabled) the model participant will supply the
    // gate and mount the control plane here; until then the option is accepted and mounts nothing.
    const gate = OPEN_GATE;
    registerModelProxy(app, { backendRoot: backendRootOf(backend), gate });
    return app;
  },
};

export default policyModel;
