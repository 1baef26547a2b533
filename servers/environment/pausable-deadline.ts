// An episode deadline whose clock stops while the episode is parked for a checkpoint
// (participants.md §1.6 rule 5): the remaining budget is frozen at park and restored at resume.

export class PausableDeadline {
  private timer: NodeJS.Timeout | undefined;
  /** Absolute expiry (ms since epoch) while running; undefined when suspended, unlimited or over. */
  private expiresAt: number | undefined;
  /** Remaining budget while suspended. */
  private frozenMs: number | undefined;
  private over = false;
  private fired = false;

  /**
   * @param budgetMs the episode's budget; null = no deadline (suspend/resume are no-ops).
   * @param onExpire called once when the budget runs out while not suspended.
   */
  constructor(
    budgetMs: number | null,
    private readonly onExpire: () => void,
  ) {
    if (budgetMs === null) {
      this.over = true;
      return;
    }
    this.arm(Math.max(0, budgetMs));
  }

  /** True once the budget ran out (the episode was told to stop). */
  get expired(): boolean {
    return this.fired;
  }

  get suspended(): boolean {
    return this.frozenMs !== undefined;
  }

  /** Remaining budget in ms; null without a deadline or once cancelled. */
  get remainingMs(): number | null {
    if (this.frozenMs !== undefined) return this.frozenMs;
    if (this.expiresAt === undefined) return this.fired ? 0 : null;
    return Math.max(0, this.expiresAt - Date.now());
  }

  /** Freeze the remaining budget (idempotent). */
  suspend(): void {
    if (this.over || this.frozenMs !== undefined || this.expiresAt === undefined) return;
    this.frozenMs = Math.max(0, this.expiresAt - Date.now());
    this.expiresAt = undefined;
    clearTimeout(this.timer);
  }

  /** Restart the clock with the frozen budget (idempotent). */
  resume(): void {
    if (this.over || this.frozenMs === undefined) return;
    const ms = this.frozenMs;
    this.frozenMs = undefined;
    this.arm(ms);
  }

  /** The episode's protocol is over (final cleanup is not timed by it). */
  cancel(): void {
    this.over = true;
    this.expiresAt = undefined;
    this.frozenMs = undefined;
    clearTimeout(this.timer);
  }

  private arm(ms: number): void {
    this.expiresAt = Date.now() + ms;
    clearTimeout(this.timer);
    // setTimeout caps at ~24.8 days; a longer budget re-arms when the timer fires early.
    this.timer = setTimeout(() => this.tick(), Math.min(ms, 2 ** 31 - 1));
    this.timer.unref?.();
  }

  private tick(): void {
    if (this.over || this.expiresAt === undefined) return;
    const left = this.expiresAt - Date.now();
    if (left > 0) return this.arm(left);
    this.over = true;
    this.fired = true;
    this.expiresAt = undefined;
    this.onExpire();
  }
}
