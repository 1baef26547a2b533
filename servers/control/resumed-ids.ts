// The 64 most recently resumed checkpoint IDs (§8.5): a stale controller's delayed prepare or
// commit for an aborted checkpoint is refused instead of closing admission again.
export const RESUMED_ID_CAPACITY = 64;

export class ResumedIds {
  private readonly ids = new Set<string>();

  constructor(private readonly capacity = RESUMED_ID_CAPACITY) {}

  has(id: string): boolean {
    return this.ids.has(id);
  }

  /** Insertion order; re-adding a present ID does not refresh it. */
  add(id: string): void {
    if (this.ids.has(id)) return;
    this.ids.add(id);
    if (this.ids.size > this.capacity) {
      const oldest = this.ids.values().next().value as string;
      this.ids.delete(oldest);
    }
  }

  get size(): number {
    return this.ids.size;
  }
}
