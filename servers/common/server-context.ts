// What one server process knows at startup: its own entry of the deployment, every peer's URL,
// the checkpoint block and the session secret. Each kind's module builds its app from this.
import type { FastifyInstance } from 'fastify';
import type { z } from 'zod';
import type { CheckpointBlock } from '../control/config.js';
import { ControlPlane } from '../control/control-plane.js';
import type { ParticipantHooks } from '../control/hooks.js';
import { mountControlPlane } from '../control/plugin.js';
import { ConfigError } from './config-error.js';
import type { Deployment, Endpoints, ServerEntry, ServerKind } from './deployment.js';
import { metricsOf } from './metrics.js';

export interface ServerContext {
  name: string;
  entry: ServerEntry;
  deployment: Deployment;
  endpoints: Endpoints;
  checkpoint: CheckpointBlock;
  sessionSecret: string;
  logLevel: string;
}

/** One implementation of a server kind: its options schema (validated by the launcher too) and its app. */
export interface ServerModule<O = unknown> {
  optionsSchema: z.ZodType<O>;
  /** Why this server type must run as one process (`workers: 1`), if it must. */
  singleProcess?: string;
  /**
   * Whether the server is a checkpoint participant (mounts the control plane) with these options;
   * absent: whenever the deployment's checkpoint block is enabled. A multi-worker server's front
   * asks, so it answers the control routes only when its workers have them.
   */
  participates?(ctx: Pick<ServerContext, 'checkpoint'>, options: O): boolean;
  build(ctx: ServerContext, options: O): Promise<FastifyInstance>;
}

/** A peer's base URL by server name; a name that is not in the deployment fails naming the option. */
export function peerUrl(ctx: ServerContext, peer: string, optionKey: string, kind?: ServerKind): string {
  const ep = ctx.endpoints[peer];
  const key = `servers.${ctx.name}.options.${optionKey}`;
  if (!ep) throw new ConfigError(key, `no server named '${peer}' in the deployment`);
  if (kind && ep.kind !== kind) throw new ConfigError(key, `server '${peer}' is a ${ep.kind} server, expected ${kind}`);
  return ep.url;
}

/**
 * Mounts the checkpoint control plane for this server when the global block enables it; returns
 * undefined otherwise (then no control routes exist and they answer 404).
 */
export async function mountParticipant(app: FastifyInstance, ctx: ServerContext, hooks: ParticipantHooks): Promise<ControlPlane | undefined> {
  if (!ctx.checkpoint.enabled) return undefined;
  const plane = new ControlPlane({
    instance: ctx.name,
    hooks,
    leaseGraceSeconds: ctx.checkpoint.lease_grace_seconds,
    log: (msg, err) => app.log.warn({ err }, msg),
    metrics: metricsOf(app),
  });
  await mountControlPlane(app, { plane, token: ctx.checkpoint.control_auth_token! });
  return plane;
}
