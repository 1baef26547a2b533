// Calls the agent cannot capture, tracked by capture key: direct `/v1/responses` calls without a
// session cookie (restarts, §3.4 step 6) and, for a restart-only agent, every call (§3.8).
// A retire cancels the covered ones once and waits for them to stop.
import type { CaptureKey, EpisodeId } from '../../protocol/ids.js';
import { covers } from './sessions.js';

interface InflightCall {
  key: CaptureKey;
  episode: EpisodeId;
  controller: AbortController;
  cancelled: boolean;
  stopped: Promise<void>;
}

export class InflightCalls {
  private readonly calls = new Set<InflightCall>();

  constructor(private readonly onChange: () => void) {}

  get size(): number {
    return this.calls.size;
  }

  keys(): CaptureKey[] {
    return [...this.calls].map((c) => c.key);
  }

  /** Runs `work` tracked under `key` until it settles; a retire aborts its signal. */
  run<T>(key: CaptureKey, episode: EpisodeId, work: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const controller = new AbortController();
    let settle!: () => void;
    const call: InflightCall = { key, episode, controller, cancelled: false, stopped: new Promise<void>((r) => (settle = r)) };
    this.calls.add(call);
    this.onChange();
    const done = (async () => work(controller.signal))();
    void done
      .catch(() => undefined)
      .finally(() => {
        this.calls.delete(call);
        settle();
        this.onChange();
      });
    return done;
  }

  /** Cancels every covered call once and returns when all have stopped. */
  cancelCovered(targets: readonly EpisodeId[], reason: unknown): Promise<void> {
    const hit = [...this.calls].filter((c) => targets.some((t) => covers(t, c.episode)));
    for (const c of hit) {
      if (c.cancelled) continue;
      c.cancelled = true;
      c.controller.abort(reason);
    }
    return Promise.all(hit.map((c) => c.stopped)).then(() => undefined);
  }

  abortAll(reason: unknown): void {
    for (const c of this.calls) c.controller.abort(reason);
  }
}
