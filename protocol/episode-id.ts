// The zod-free core of episode identity (control-plane.md §2.2–2.3): what a storage worker thread
// needs, without the cost of loading zod there. protocol/ids.ts builds the schemas on it.

/** First char alphanumeric, then letters, digits, `.`, `_`, `-`. */
export const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
/** `-a<N>` with N positive and without a leading zero, at the very end. */
export const RESERVED_SUFFIX = /-a([1-9][0-9]*)$/;

export type CaptureKey = string;

export interface EpisodeId {
  rollout_id: string;
  attempt: number;
}

export function isValidRolloutId(id: string): boolean {
  return ID_PATTERN.test(id) && !RESERVED_SUFFIX.test(id);
}

/** A JSON object holding exactly the `EpisodeIdSchema` fields, valid: the ID; anything else: undefined. */
export function decodeEpisodeId(v: unknown): EpisodeId | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const o = v as Record<string, unknown>;
  for (const k in o) if (k !== 'rollout_id' && k !== 'attempt') return undefined;
  const rollout = o.rollout_id;
  if (typeof rollout !== 'string' || !isValidRolloutId(rollout)) return undefined;
  const attempt = o.attempt === undefined ? 0 : o.attempt;
  if (typeof attempt !== 'number' || !Number.isSafeInteger(attempt) || attempt < 0) return undefined;
  return { rollout_id: rollout, attempt };
}

export function captureKey(e: EpisodeId): CaptureKey {
  return e.attempt === 0 ? e.rollout_id : `${e.rollout_id}-a${e.attempt}`;
}

/** Decodes exactly one suffix; the remainder must itself be a valid rollout ID (§2.2). */
export function parseCaptureKey(key: string): EpisodeId | undefined {
  const m = RESERVED_SUFFIX.exec(key);
  let rollout = key;
  let attempt = 0;
  if (m) {
    rollout = key.slice(0, m.index);
    attempt = Number(m[1]);
    if (!Number.isSafeInteger(attempt)) return undefined;
  }
  return isValidRolloutId(rollout) ? { rollout_id: rollout, attempt } : undefined;
}
