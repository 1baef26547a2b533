// Which worker of a multi-worker server owns a request (docs/multi-worker.md): every request of a
// rollout goes to one worker, chosen from its rollout ID alone, so all its attempts (the restored
// N+1 included) land where its earlier state, retire marks and restored records are, and the owner
// never changes while the server lives. Stateless: no alias table to keep or lose.
import { parseRolloutPath } from '../../protocol/ids.js';

/** FNV-1a (32 bit) of the rollout ID, modulo the number of workers: even spread, no state. */
export function ownerOf(rolloutId: string, workers: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < rolloutId.length; i++) {
    h ^= rolloutId.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0) % workers;
}

/** The rollout a data-plane URL names by its `/ng-rollout/<capture key>` prefix, if any. */
export function rolloutOfUrl(url: string): string | undefined {
  const parsed = parseRolloutPath(url);
  if (!parsed) return undefined;
  // An undecodable key still routes consistently; its owner refuses it as the protocol says.
  return parsed.episode?.rollout_id ?? parsed.key;
}

/** An environment's `/run`: its rollout is in its body, not its URL. */
export function isRunRequest(method: string | undefined, target: string | undefined): boolean {
  return method === 'POST' && (target ?? '/').split('?')[0] === '/run';
}

/** The rollout an environment `/run` body names (`episode_id.rollout_id`), if it parses. */
export function rolloutOfRunBody(body: Buffer): string | undefined {
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { episode_id?: { rollout_id?: unknown } } | null;
    const id = parsed?.episode_id?.rollout_id;
    return typeof id === 'string' ? id : undefined;
  } catch {
    return undefined; // the worker that gets it answers the typed refusal
  }
}

/** The worker IDs' partition of `items` by their rollout's owner. */
export function partition<T>(items: readonly T[], rolloutOf: (item: T) => string, workers: number): T[][] {
  const out: T[][] = Array.from({ length: workers }, () => []);
  for (const item of items) out[ownerOf(rolloutOf(item), workers)]!.push(item);
  return out;
}
