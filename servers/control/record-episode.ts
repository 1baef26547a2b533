// How a records line names its episode (control-plane.md §9.4, §2.3): shared by the storage
// reader and its worker thread.
import { isValidRolloutId, type EpisodeId } from '../../protocol/ids.js';

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/** A stored `episode_id` (§2.3 object form, `attempt` optional, no other keys). */
export function decodeEpisodeId(v: unknown): EpisodeId | undefined {
  if (!isPlainObject(v)) return undefined;
  let n = 0;
  for (const k in v) {
    if (k !== 'rollout_id' && k !== 'attempt') return undefined;
    n++;
  }
  const rollout = v.rollout_id;
  if (typeof rollout !== 'string' || !isValidRolloutId(rollout)) return undefined;
  const attempt = v.attempt === undefined ? 0 : v.attempt;
  if (typeof attempt !== 'number' || !Number.isSafeInteger(attempt) || attempt < 0) return undefined;
  return n > 0 ? { rollout_id: rollout, attempt } : undefined;
}
