// genrm_compare (participants.md §4.10): group-scored cohort verification with a deterministic
// judge (genrm-judge.ts). Declared `stateless` + `replay`, and verification must replay: a
// member's `/verify` waits for its siblings, so a checkpoint that waited on it could deadlock
// while siblings are still generating. Cohort state lives in memory; after a crash the group
// re-forms from the replayed verifies.
//
// Grouping: `_ng_group_id` + `_ng_group_attempt` (default 0), slot `_ng_rollout_index`, read from
// the verify body's task fields (the environment merges task_data into the body; a nested
// `task_data` is read too). Without a group ID the legacy `_ng_task_index` groups the rows.
import { z } from 'zod';
import { ProtocolError, refuse } from '../../protocol/errors.js';
import { sendRefusal } from '../common/metrics.js';
import type { ServerModule } from '../common/server-context.js';
import { buildResourcesServer, checkpointOptionFields, seedReply, taskField } from './base.js';
import { CohortRegistry, type CohortMember } from './genrm-cohorts.js';
import { answerText } from './genrm-judge.js';

export const GenrmCompareOptionsSchema = z.strictObject({
  ...checkpointOptionFields({ mode: 'stateless', verify: 'replay' }),
  // No session state to export; verification that waits would deadlock a checkpoint.
  checkpoint_mode: z
    .enum(['stateless', 'restart_only'], { error: "genrm_compare keeps no session state: use 'stateless' or 'restart_only'" })
    .default('stateless'),
  checkpoint_verify: z.enum(['replay'], { error: "genrm_compare verification must be 'replay' (a member's /verify waits for its siblings)" }).default('replay'),
  num_rollouts_per_prompt: z.number().int().min(1).default(1),
  cohort_collection_timeout_s: z.number().positive().finite().default(1800),
  comparison: z.enum(['circular', 'all_pairs']).default('circular'),
});
export type GenrmCompareOptions = z.infer<typeof GenrmCompareOptionsSchema>;

type Coordinates = { ok: true; member: Omit<CohortMember, 'text'> } | { ok: false; detail: string };

/** The cohort coordinates of a verify body; anything malformed is a 422. */
export function cohortCoordinates(body: unknown): Coordinates {
  const bad = (detail: string): Coordinates => ({ ok: false, detail });
  const gid = taskField(body, '_ng_group_id');
  let groupId: string;
  if (typeof gid === 'string' && gid.length > 0) groupId = gid;
  else if (typeof gid === 'number' && Number.isFinite(gid)) groupId = String(gid);
  else if (gid === undefined || gid === null) {
    const task = taskField(body, '_ng_task_index');
    if (!Number.isSafeInteger(task)) return bad('_ng_group_id is required (or the legacy _ng_task_index)');
    groupId = `task:${task as number}`;
  } else return bad('_ng_group_id must be a non-empty string');
  const att = taskField(body, '_ng_group_attempt') ?? 0;
  if (!Number.isSafeInteger(att) || (att as number) < 0) return bad(`_ng_group_attempt must be an integer >= 0, got ${JSON.stringify(att)}`);
  const slot = taskField(body, '_ng_rollout_index');
  if (!Number.isSafeInteger(slot)) return bad(`_ng_rollout_index must be an integer, got ${JSON.stringify(slot)}`);
  const prompt = taskField(body, 'prompt_id');
  const promptId = typeof prompt === 'string' || typeof prompt === 'number' ? String(prompt) : undefined;
  return { ok: true, member: { groupId, attempt: att as number, slot: slot as number, promptId } };
}

const genrmCompare: ServerModule<GenrmCompareOptions> = {
  optionsSchema: GenrmCompareOptionsSchema,
  // Siblings of one prompt are different rollouts (different owners), and a cohort meets in one process.
  singleProcess: 'a cohort of siblings is collected and compared in one process',
  async build(ctx, options) {
    const opts = GenrmCompareOptionsSchema.parse(options);
    const registry = new CohortRegistry({
      size: opts.num_rollouts_per_prompt,
      collectionTimeoutMs: opts.cohort_collection_timeout_s * 1000,
      comparison: opts.comparison,
    });

    const app = await buildResourcesServer(ctx, opts, {
      groupScored: { group_size: opts.num_rollouts_per_prompt, cohort_collection_timeout_s: opts.cohort_collection_timeout_s },
      routes(app, sessions) {
        app.post('/seed_session', async (req) => seedReply(req.body, sessions.of(req)));

        app.post('/verify', async (req, reply) => {
          const body = (req.body ?? {}) as Record<string, unknown>;
          const coords = cohortCoordinates(body);
          if (!coords.ok) return sendRefusal(reply, refuse('invalid_cohort_coordinates', coords.detail));
          const outcome = await registry.submit({ ...coords.member, text: answerText(body.response) });
          if (!outcome.ok) return sendRefusal(reply, new ProtocolError(outcome.code, outcome.detail, outcome.status));
          return {
            ...body,
            reward: outcome.reward,
            mask_sample: outcome.maskSample,
            ...(outcome.failure ? { failure_kind: outcome.failure.kind, failure_reason: outcome.failure.reason } : {}),
          };
        });

        app.post('/close_session', async (req) => ({ resources_session_id: sessions.of(req) }));
      },
    });
    app.addHook('onClose', async () => registry.close());
    return app;
  },
};

export default genrmCompare;
