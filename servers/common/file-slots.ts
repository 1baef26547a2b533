// Bounded concurrent file operations. A promise-based write holds its descriptor from open to
// close while it waits for libuv's four threads, so N writes started at once hold N descriptors:
// 7,600 model calls answered together, beside their 15,200 sockets, ran a model process out of
// its 20,000 (`EMFILE`) and every call whose capture row could not be written was withheld.
// File creation is latency-bound: some parallelism pays, unbounded does not.

export class FileSlots {
  private active = 0;
  private readonly queue: Array<() => void> = [];
  constructor(private readonly limit: number) {}

  /** Runs `work` in a slot. `work` must not itself wait for a slot of the same instance. */
  async run<T>(work: () => Promise<T>): Promise<T> {
    // A finishing holder hands its slot straight to the next waiter, so nobody slips in between.
    if (this.active >= this.limit) await new Promise<void>((r) => this.queue.push(r));
    else this.active++;
    try {
      return await work();
    } finally {
      const next = this.queue.shift();
      if (next) next();
      else this.active--;
    }
  }
}

/** Slots for a process's per-call file writes (each is one small file operation). */
export const callFileSlots = new FileSlots(64);
