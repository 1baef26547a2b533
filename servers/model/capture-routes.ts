// Read access to the capture ledger over HTTP (participants.md §5.4): the manifest of one capture
// key, as the e2e suite reads it. Bearer-protected with the control token; a retired ledger
// answers 410 with a detail saying it "is retired".
import type { FastifyInstance } from 'fastify';
import { ProtocolError, refuse } from '../../protocol/errors.js';
import { parseCaptureKey, type EpisodeId } from '../../protocol/ids.js';
import { bearerMatches } from '../control/plugin.js';
import type { ModelParticipant } from './participant.js';

export const CAPTURE_MANIFEST_ROUTE = '/training-token-capture/control/rollouts/:key/manifest';

export function registerCaptureRoutes(
  app: FastifyInstance,
  opts: { participant: ModelParticipant; token: string; isRetired: (e: EpisodeId) => boolean },
): void {
  app.get<{ Params: { key: string } }>(CAPTURE_MANIFEST_ROUTE, async (req) => {
    if (!opts.token || !bearerMatches(req.headers.authorization, opts.token)) throw refuse('unauthorized', 'missing or wrong bearer token');
    const key = req.params.key;
    const episode = parseCaptureKey(key);
    if (!episode) throw refuse('invalid_rollout_id', `'${key}' is not a capture key`);
    if (opts.isRetired(episode)) throw new ProtocolError('stale_attempt', `capture ledger ${key} is retired`, 410);
    const rows = opts.participant.ledger.rows(key);
    return { capture_key: key, records: rows, staging_keys: rows.map((r) => r.staging_key).filter((k): k is string => typeof k === 'string') };
  });
}
