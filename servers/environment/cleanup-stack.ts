// The cleanups one episode registers (participants.md §2.4, §2.7 step 6): remote sessions to close.
// Final cleanup runs them newest-first, each at most once successfully, all within one timeout,
// and is shielded from the episode's cancellation (it gets its own signal, never the episode's).
// A callback that failed stays pending, so a later registration that closes it retries it once.
import { untilAborted } from '../common/async.js';

export type CleanupCallback = (signal: AbortSignal) => Promise<void>;

interface Entry {
  name: string;
  callback: CleanupCallback;
  active: boolean;
  /** Serializes concurrent closes of one entry (a close during the protocol and the final unwind). */
  running: Promise<void> | undefined;
}

export class CleanupHandle {
  constructor(
    private readonly entry: Entry,
    private readonly timeoutMs: number,
  ) {}

  get pending(): boolean {
    return this.entry.active;
  }

  /**
   * Runs the callback unless it already succeeded, bounded by `signal` when given (a close during
   * the protocol is a stage like the others: it stops with the episode, at its deadline or retire),
   * else by the cleanup timeout (final cleanup: participants.md §2.7 bounds that step alone). A
   * protocol close cut by the cleanup timeout failed episodes whose agent was only slow: 16,000
   * released at once kept the agent busy for minutes, and 8,288 closes timed out.
   */
  async close(signal?: AbortSignal): Promise<void> {
    const bound = signal ?? AbortSignal.timeout(this.timeoutMs);
    for (;;) {
      const running = this.entry.running;
      if (running) {
        await untilAborted(
          running.catch(() => undefined),
          bound,
        );
        continue;
      }
      if (!this.entry.active) return;
      const run = this.entry.callback(bound).then(() => {
        this.entry.active = false;
      });
      this.entry.running = run;
      try {
        return await untilAborted(run, bound);
      } finally {
        if (this.entry.running === run) {
          // A callback cut off by its signal may still settle later; it no longer holds the entry.
          this.entry.running = undefined;
          run.catch(() => undefined);
        }
      }
    }
  }
}

export class CleanupStack {
  private readonly entries: Entry[] = [];

  constructor(
    private readonly timeoutMs: number,
    private readonly log: (msg: string, err?: unknown) => void = () => undefined,
  ) {}

  register(name: string, callback: CleanupCallback): CleanupHandle {
    const entry: Entry = { name, callback, active: true, running: undefined };
    this.entries.push(entry);
    return new CleanupHandle(entry, this.timeoutMs);
  }

  /** Final cleanup: newest-first, failures logged and skipped, everything within the timeout. */
  async unwind(): Promise<void> {
    const overall = AbortSignal.timeout(this.timeoutMs);
    for (const entry of [...this.entries].reverse()) {
      if (overall.aborted) {
        this.log(`episode cleanup timed out before '${entry.name}'`);
        return;
      }
      try {
        await new CleanupHandle(entry, this.timeoutMs).close(overall);
      } catch (err) {
        this.log(`episode cleanup failed: ${entry.name}`, err);
      }
    }
  }
}
