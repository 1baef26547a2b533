// The small async primitives the servers share: a FIFO lock, counted slots, the admission gate,
// and waits a caller's AbortSignal can cut short. Hand-written because `async-mutex` (the
// well-kept choice) takes no AbortSignal in its waits: a waiter can only be cancelled all at once.

/** A FIFO async lock: every phase transition of one participant runs under one (§8.8). */
export class Mutex {
  private tail: Promise<void> = Promise.resolve();

  async run<T>(fn: () => Promise<T> | T): Promise<T> {
    const prev = this.tail;
    let release!: () => void;
    this.tail = new Promise<void>((r) => {
      release = r;
    });
    await prev;
    try {
      return await fn();
    } finally {
      release();
    }
  }
}

/**
 * A FIFO semaphore: at most `limit` holders; a freed slot goes straight to the oldest waiter, so
 * no newcomer slips in between. Used for the episode limit (`max_concurrent_episodes`,
 * participants.md §2.7) and to bound concurrent file operations (each holds a descriptor from
 * open to close while it waits for libuv's threads: unbounded, a busy model server ran out of them).
 */
export class Slots {
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
  acquire(timeoutMs: number | null = null): Promise<boolean> {
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

  /** Runs `work` in a slot. `work` must not itself wait for a slot of the same instance. */
  async run<T>(work: () => Promise<T>): Promise<T> {
    await this.acquire();
    try {
      return await work();
    } finally {
      this.release();
    }
  }
}

/**
 * A data-plane gate each participant kind uses for its admission hooks: closed from prepare (or
 * restore) until resume. Waiters park without polling and wake when it reopens.
 */
export class AdmissionGate {
  private open = true;
  private waiters: Array<() => void> = [];

  get isOpen(): boolean {
    return this.open;
  }

  close(): void {
    this.open = false;
  }

  reopen(): void {
    this.open = true;
    const w = this.waiters;
    this.waiters = [];
    for (const wake of w) wake();
  }

  /** Resolves once the gate is open; rejects with the signal's reason when aborted first. */
  wait(signal?: AbortSignal): Promise<void> {
    if (this.open) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const wake = (): void => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = (): void => {
        this.waiters = this.waiters.filter((x) => x !== wake);
        reject(signal!.reason);
      };
      if (signal?.aborted) return reject(signal.reason);
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(wake);
    });
  }
}

/** `work`'s outcome, or the signal's reason as soon as it aborts (the work itself goes on). */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

/** Rejects with the signal's reason when it aborts; never resolves (a `Promise.race` arm). */
export function abortedSignal(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) return reject(signal.reason);
    signal.addEventListener('abort', () => reject(signal.reason), { once: true });
  });
}

/** Waits `ms`, or less when the signal aborts first; never rejects (a pause between retries). */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done(): void {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    if (signal?.aborted) return done();
    signal?.addEventListener('abort', done, { once: true });
  });
}
