// Per rollout, the highest retired attempt (§8.7). Marks only rise and are removed only by
// `forget`: a request a caller sent just before its own retire may reach a callee after the
// callee's retire finished, and must still be refused.
import type { EpisodeId } from '../../protocol/ids.js';

export class RetireMarks {
  private readonly marks = new Map<string, number>();

  mark(e: EpisodeId): void {
    const cur = this.marks.get(e.rollout_id);
    if (cur === undefined || e.attempt > cur) this.marks.set(e.rollout_id, e.attempt);
  }

  markAll(episodes: Iterable<EpisodeId>): void {
    for (const e of episodes) this.mark(e);
  }

  /** True when this attempt (or a later one) of its rollout was retired. */
  isRetired(e: EpisodeId): boolean {
    const cur = this.marks.get(e.rollout_id);
    return cur !== undefined && e.attempt <= cur;
  }

  markOf(rolloutId: string): number | undefined {
    return this.marks.get(rolloutId);
  }

  forget(rolloutIds: Iterable<string>): void {
    for (const r of rolloutIds) this.marks.delete(r);
  }

  get size(): number {
    return this.marks.size;
  }
}
