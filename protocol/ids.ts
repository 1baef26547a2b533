// Identity on the wire (control-plane.md §2): rollout IDs, EpisodeIds, capture keys and the
// `/ng-rollout/<key>` data-plane prefix. Checkpoint IDs and path components (§4, §9.1).
import { z } from 'zod';
import { ID_PATTERN, RESERVED_SUFFIX, decodeEpisodeId, parseCaptureKey, type CaptureKey, type EpisodeId } from './episode-id.js';

export { ID_PATTERN, captureKey, decodeEpisodeId, isValidRolloutId, parseCaptureKey, type CaptureKey, type EpisodeId } from './episode-id.js';

export const RolloutIdSchema = z
  .string()
  .min(1)
  .regex(ID_PATTERN, 'rollout_id must match ^[A-Za-z0-9][A-Za-z0-9._-]*$')
  .refine((s) => !RESERVED_SUFFIX.test(s), 'rollout_id must not end with a reserved -a<N> suffix');

export const AttemptSchema = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);

/** Wire form in control requests: closed object, `attempt` defaults to 0 (§2.3). */
export const EpisodeIdSchema = z.strictObject({
  rollout_id: RolloutIdSchema,
  attempt: AttemptSchema.default(0),
});

/**
 * `z.array(schema)` with a plain loop in front: `fast` accepts an element the schema would accept
 * and return unchanged (or decodes it as the schema would); anything else goes through `schema`,
 * so the issues and their paths are zod's own. For lists with thousands of elements on a hot path.
 */
function listWithFastPath<T>(fast: (item: unknown) => T | undefined, schema: z.ZodType<T>, min = 0) {
  return z
    .array(z.unknown())
    .min(min)
    .transform((items, ctx): T[] => {
      const out = new Array<T>(items.length);
      for (let i = 0; i < items.length; i++) {
        const quick = fast(items[i]);
        if (quick !== undefined) {
          out[i] = quick;
          continue;
        }
        const r = schema.safeParse(items[i]);
        if (r.success) out[i] = r.data;
        else for (const issue of r.error.issues) ctx.addIssue({ ...issue, path: [i, ...issue.path] } as never);
      }
      return out;
    });
}

/**
 * `z.array(EpisodeIdSchema)`, fast: a commit or restore names every episode in scope (7,600 per
 * participant), and zod's object parse per element, in a process that had not warmed it up, was
 * a large part of a fresh server's restore (`npm run bench -- scale --profile`).
 */
export function episodeIdList(min = 0) {
  return listWithFastPath(decodeEpisodeId, EpisodeIdSchema, min);
}

export const CaptureKeySchema = z.string().refine((k) => parseCaptureKey(k) !== undefined, 'not a valid capture key');

/**
 * `z.array(CaptureKeySchema)`, fast: a snapshot manifest lists every committed episode per
 * participant, and the refine per element, in a worker that had not warmed it up, ran while Gym
 * admission is closed.
 */
export function captureKeyList() {
  return listWithFastPath((item) => (typeof item === 'string' && parseCaptureKey(item) !== undefined ? item : undefined), CaptureKeySchema);
}

export function episodeOf(rollout_id: string, attempt = 0): EpisodeId {
  return { rollout_id, attempt };
}

export function sameEpisode(a: EpisodeId, b: EpisodeId): boolean {
  return a.rollout_id === b.rollout_id && a.attempt === b.attempt;
}

/** The next physical attempt of the same rollout (a replacement after restore or retire). */
export function nextAttempt(e: EpisodeId): EpisodeId {
  return { rollout_id: e.rollout_id, attempt: e.attempt + 1 };
}

/** Sorted, de-duplicated capture keys: the order every reply lists them in. */
export function sortedKeys(keys: Iterable<CaptureKey>): CaptureKey[] {
  return [...new Set(keys)].sort();
}

// --- data-plane prefix (§2.4) ---------------------------------------------------------

const ROLLOUT_PREFIX = /^\/ng-rollout\/([A-Za-z0-9][A-Za-z0-9._-]*)(\/.*)$/;

export interface RolloutPath {
  /** The capture key as written in the URL. */
  key: CaptureKey;
  /** Decoded episode, or undefined when the key does not decode (→ `invalid_rollout_id`). */
  episode: EpisodeId | undefined;
  /** The original path with the prefix stripped (starts with `/`). */
  rest: string;
}

/** Splits `/ng-rollout/<key>/<path>`; returns undefined for a URL without the prefix. */
export function parseRolloutPath(url: string): RolloutPath | undefined {
  const m = ROLLOUT_PREFIX.exec(url);
  if (!m) return undefined;
  const key = m[1]!;
  return { key, episode: parseCaptureKey(key), rest: m[2]! };
}

export function rolloutPath(key: CaptureKey, path: string): string {
  return `/ng-rollout/${key}${path.startsWith('/') ? path : `/${path}`}`;
}

// --- other identifiers -----------------------------------------------------------------

/** Checkpoint IDs: 1–128 chars of the ID pattern (§4). */
export const CheckpointIdSchema = z.string().min(1).max(128).regex(ID_PATTERN, 'checkpoint_id must match ^[A-Za-z0-9][A-Za-z0-9._-]*$');

/** Kind and instance become path components of the storage layout (§9.1). */
export function isSafePathComponent(s: string): boolean {
  return ID_PATTERN.test(s);
}

export const KINDS = ['environment', 'model', 'agent', 'resources'] as const;
export type Kind = (typeof KINDS)[number];
export const KindSchema = z.enum(KINDS);

/** Prepare stage of each kind (§13); resume runs in reverse. */
export const PREPARE_ORDER: readonly Kind[] = ['environment', 'model', 'agent', 'resources'];
/** Retire/forget groups, callers before callees (§11.8). */
export const RETIRE_GROUPS: readonly (readonly Kind[])[] = [['environment'], ['agent'], ['model', 'resources']];
