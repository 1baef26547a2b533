// A data-plane gate each participant kind uses for its admission hooks: closed from prepare
// (or restore) until resume. Waiters park without polling and wake when it reopens.
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
