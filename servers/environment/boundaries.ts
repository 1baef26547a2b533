// The five boundaries of the `single_agent_turn` protocol (participants.md §2.4, §2.6): each stage
// starts by recording one, naming itself as `next` with what it needs. Restored records are
// validated with these before install, so a replacement never starts from a malformed boundary.
import { z } from 'zod';
import { RunResultSchema } from '../../protocol/tasks.js';
import { SessionHandlesSchema } from './handles.js';

export const STAGES = ['seed', 'invoke_agent', 'close_agent', 'verify', 'return'] as const;
export type Stage = (typeof STAGES)[number];

const ResponseSchema = z.looseObject({});

export const StageBoundarySchema = z.discriminatedUnion('next', [
  z.looseObject({ next: z.literal('seed'), handles: SessionHandlesSchema }),
  z.looseObject({ next: z.literal('invoke_agent'), handles: SessionHandlesSchema }),
  z.looseObject({ next: z.literal('close_agent'), handles: SessionHandlesSchema, response: ResponseSchema }),
  z.looseObject({
    next: z.literal('verify'),
    handles: SessionHandlesSchema,
    response: ResponseSchema,
    observations: z.unknown().default(null),
  }),
  z.looseObject({
    next: z.literal('return'),
    handles: SessionHandlesSchema,
    result: RunResultSchema,
    observations: z.unknown().default(null),
  }),
]);
export type StageBoundary = z.infer<typeof StageBoundarySchema>;

/** The environment's checkpoint record (§2.6): `boundary` null = start over from input. */
export const EpisodeRecordSchema = z.looseObject({
  episode_id: z.object({ rollout_id: z.string(), attempt: z.number().int().min(0) }),
  task_digest: z.string().regex(/^[0-9a-f]{64}$/, 'task_digest must be 64 lowercase hex characters'),
  boundary: StageBoundarySchema.nullable(),
});
export type EpisodeRecord = z.infer<typeof EpisodeRecordSchema>;

/**
 * Plain JSON of a record read back by the lossless reader: numbers it kept as text (`1.0`) or as
 * bigints become numbers, order-preserving objects become plain ones. Our own records need none of
 * this; a record written by another implementation may.
 */
export { toPlainJson } from '../../protocol/lossless-json.js';
