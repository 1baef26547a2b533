// The environment server, `single_agent_turn` protocol (participants.md §2): `/run` drives one
// episode through the agent and resources servers named in its options, `/aggregate_metrics` is
// forwarded to the resources server, and the control plane (kind `environment`) is mounted when
// the deployment enables checkpointing.
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { refuse } from '../../protocol/errors.js';
import { assertExpectedInstance, INSTANCE_HEADER, RunRequestSchema } from '../../protocol/tasks.js';
import { createGymApp } from '../common/app.js';
import { callJson } from '../common/http-client.js';
import { sendRefusal } from '../common/metrics.js';
import { mountParticipant, peerUrl, type ServerContext, type ServerModule } from '../common/server-context.js';
import type { ControlPlane } from '../control/control-plane.js';
import { AttemptReplies } from './attempt-replies.js';
import { Slots } from '../common/async.js';
import { EpisodeRunner } from './episode-runner.js';
import { EnvironmentParticipant } from './participant.js';

export const EnvironmentOptionsSchema = z
  .strictObject({
    /** The agent server (by name) that runs the turn. */
    agent: z.string().min(1),
    /** The resources server (by name) that seeds, serves tools, verifies. */
    resources: z.string().min(1),
    /** Episode budget, not counting time parked for a checkpoint; null = none. */
    default_episode_timeout_seconds: z.number().positive().nullable().default(null),
    /** Total budget of an episode's final cleanup. */
    cleanup_timeout_seconds: z.number().positive().default(30),
    max_concurrent_episodes: z.number().int().positive().nullable().default(null),
    queue_timeout_seconds: z.number().positive().nullable().default(null),
    /** False: no boundaries are recorded and every episode is a restart. */
    checkpoint_boundaries: z.boolean().default(true),
    /** Finished `/run` replies kept for duplicates until `forget` (oldest evicted beyond this). */
    kept_replies_max: z.number().int().positive().default(10_000),
  })
  .superRefine((o, ctx) => {
    if (o.max_concurrent_episodes !== null && o.queue_timeout_seconds === null) {
      ctx.addIssue({ code: 'custom', path: ['queue_timeout_seconds'], message: 'required when max_concurrent_episodes is set' });
    }
  });
export type EnvironmentOptions = z.infer<typeof EnvironmentOptionsSchema>;

export interface EnvironmentServer {
  app: FastifyInstance;
  participant: EnvironmentParticipant;
  plane: ControlPlane | undefined;
  replies: AttemptReplies;
}

/** Builds the app and returns its parts (tests look inside; the module export returns the app). */
export async function buildEnvironment(ctx: ServerContext, options: EnvironmentOptions): Promise<EnvironmentServer> {
  const agentUrl = peerUrl(ctx, options.agent, 'agent', 'agent');
  const resourcesUrl = peerUrl(ctx, options.resources, 'resources', 'resources');
  const app = createGymApp({ name: ctx.name, kind: 'environment', logLevel: ctx.logLevel });

  const replies = new AttemptReplies({
    maxKept: options.kept_replies_max,
    onEvict: (key) => app.log.warn({ episode: key }, 'kept /run reply evicted (kept_replies_max reached); a late duplicate will be refused'),
  });
  const participant = new EnvironmentParticipant({
    checkpointBoundaries: options.checkpoint_boundaries,
    replies,
    peers: { agent: options.agent, resources: options.resources },
  });
  const plane = await mountParticipant(app, ctx, participant);
  participant.attach(plane);

  const seconds = (s: number | null): number | null => (s === null ? null : s * 1000);
  const runner = new EpisodeRunner({
    participant,
    replies,
    peers: { agentUrl, resourcesUrl, resourcesName: options.resources },
    slots: options.max_concurrent_episodes === null ? undefined : new Slots(options.max_concurrent_episodes),
    queueTimeoutMs: seconds(options.queue_timeout_seconds),
    episodeTimeoutMs: seconds(options.default_episode_timeout_seconds),
    cleanupTimeoutMs: options.cleanup_timeout_seconds * 1000,
    log: app.log,
  });

  app.post('/run', async (req, reply) => {
    // Ours: a controller that dispatched to an earlier process of this server (before a crash)
    // must not start the attempt again from its input here; it restores and redispatches instead.
    if (plane) assertExpectedInstance(req.headers[INSTANCE_HEADER], plane.instanceId);
    const parsed = RunRequestSchema.safeParse(req.body);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      throw refuse('invalid_request', `/run body invalid at ${issue.path.join('.') || '(root)'}: ${issue.message}`);
    }
    const outcome = await runner.run(parsed.data);
    if ('refusal' in outcome) return sendRefusal(reply, outcome.refusal);
    return reply.code(outcome.status).send(outcome.body);
  });

  app.post('/aggregate_metrics', async (req, reply) => {
    const r = await callJson(resourcesUrl, '/aggregate_metrics', req.body ?? {});
    return reply.code(r.status).send(r.body);
  });

  return { app, participant, plane, replies };
}

export { INSTANCE_HEADER };

const environmentModule: ServerModule<EnvironmentOptions> = {
  optionsSchema: EnvironmentOptionsSchema,
  async build(ctx, options) {
    return (await buildEnvironment(ctx, options)).app;
  },
};

export default environmentModule;
