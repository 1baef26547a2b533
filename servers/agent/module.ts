// The agent server (kind `agent`, type `simple_agent`): seeds sessions, runs activations (the turn
// loop against the policy model server and the granted tools) and, with checkpointing on, is the
// `agent` participant — full (sessions park at boundaries and are exported) or restart-only.
import { createGymApp } from '../common/app.js';
import { mountParticipant, peerUrl, type ServerContext, type ServerModule } from '../common/server-context.js';
import { cancelActivation } from './activate.js';
import { AgentCore } from './core.js';
import { AgentOptionsSchema, type AgentOptions } from './options.js';
import { fullParticipantHooks } from './participant.js';
import { restartOnlyHooks } from './restart-only.js';
import { registerAgentRoutes } from './routes.js';

export { AgentOptionsSchema, type AgentOptions };

const simpleAgent: ServerModule<AgentOptions> = {
  optionsSchema: AgentOptionsSchema,
  async build(ctx: ServerContext, options: AgentOptions) {
    const modelUrl = peerUrl(ctx, options.model, 'model', 'model');
    const app = createGymApp({ name: ctx.name, kind: 'agent', logLevel: ctx.logLevel });
    const core = new AgentCore(ctx.name, options, modelUrl, ctx.sessionSecret, app.log);
    const hooks = core.mode === 'full' ? fullParticipantHooks(core) : restartOnlyHooks(core);
    core.plane = await mountParticipant(app, ctx, hooks);
    registerAgentRoutes(app, core);
    app.addHook('preClose', async () => {
      // Parked and running work ends so the server can close; nothing is freed or exported.
      const reason = new Error(`agent server '${ctx.name}' is shutting down`);
      core.shutdown.abort(reason);
      for (const s of core.sessions.values()) if (s.running) cancelActivation(s.running, reason);
      core.inflight.abortAll(reason);
    });
    return app;
  },
};

export default simpleAgent;
