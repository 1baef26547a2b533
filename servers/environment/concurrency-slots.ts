// The optional episode concurrency limit (`max_concurrent_episodes`, participants.md §2.7 step 1):
// a FIFO semaphore whose waiters give up after `queue_timeout_seconds`.

export class ConcurrencySlots {
  private free: number;
  private readonly queue: Array<(granted: boolean) => void> = [];

  constructor(readonly limit: number) {
    this.free = limit;
  }

  get inUse(): number {
    return this.limit - this.free;
  }

  get waiting(): number {
    return this.queue.length;
  }

  /** Resolves true with a slot held, or false when `timeoutMs` passed first (null = wait forever). */
  acquire(timeoutMs: number | null): Promise<boolean> {
    if (this.free > 0 && this.queue.length === 0) {
      this.free -= 1;
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const grant = (granted: boolean): void => {
        clearTimeout(timer);
        resolve(granted);
      };
      this.queue.push(grant);
      if (timeoutMs !== null) {
        timer = setTimeout(() => {
          const i = this.queue.indexOf(grant);
          if (i >= 0) this.queue.splice(i, 1);
          grant(false);
        }, timeoutMs);
      }
    });
  }

  release(): void {
    const next = this.queue.shift();
    if (next) next(true);
    else this.free += 1;
  }
}
