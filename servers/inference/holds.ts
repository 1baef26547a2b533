// Test holds (participants.md §6.1): `{after_calls: n}` parks every call whose global index is
// ≥ n; `{after_calls_per_rollout: n}` parks a call once its rollout already made n calls, so
// every rollout stops at the same boundary; `rollout_pattern` limits a rule to matching capture keys and
// `{rules: [...]}` holds different rollouts at different calls. Held calls wait until `release`.
import { z } from 'zod';

const PerRolloutRule = z.strictObject({
  after_calls_per_rollout: z.number().int().min(0),
  /** Only rollouts whose capture key matches this regular expression (default: every rollout). */
  rollout_pattern: z
    .string()
    .refine((p) => {
      try {
        new RegExp(p);
        return true;
      } catch {
        return false;
      }
    }, 'rollout_pattern must be a valid regular expression')
    .optional(),
});

export const HoldRequestSchema = z.union([
  z.strictObject({ after_calls: z.number().int().min(0) }),
  PerRolloutRule,
  /** Several per-rollout rules: the first whose pattern matches a rollout decides for it. */
  z.strictObject({ rules: z.array(PerRolloutRule).min(1) }),
]);
export type HoldRule = z.infer<typeof HoldRequestSchema>;
type PerRollout = z.infer<typeof PerRolloutRule>;

function perRolloutApplies(rules: readonly PerRollout[], captureKey: string, prior: number): boolean {
  for (const r of rules) {
    if (r.rollout_pattern !== undefined && !new RegExp(r.rollout_pattern).test(captureKey)) continue;
    return prior >= r.after_calls_per_rollout;
  }
  return false;
}

export class HoldAbortedError extends Error {
  constructor(readonly reason: unknown) {
    super('held call aborted');
    this.name = 'HoldAbortedError';
  }
}

export class Holds {
  private rule: HoldRule | undefined;
  private waiters = new Set<() => void>();

  /** Placing a hold while one is active keeps the calls already waiting (they wait for the same release). */
  place(rule: HoldRule): void {
    this.rule = rule;
  }

  get active(): HoldRule | undefined {
    return this.rule;
  }

  /** Whether a call arriving now must wait. */
  applies(index: number, priorRolloutCalls: number, captureKey = ''): boolean {
    const r = this.rule;
    if (!r) return false;
    if ('after_calls' in r) return index >= r.after_calls;
    return perRolloutApplies('rules' in r ? r.rules : [r], captureKey, priorRolloutCalls);
  }

  get waiting(): number {
    return this.waiters.size;
  }

  /** Waits for `release`; rejects with HoldAbortedError when `signal` aborts (the waiter is dropped). */
  wait(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(new HoldAbortedError(signal.reason));
    return new Promise((resolve, reject) => {
      const wake = (): void => {
        signal.removeEventListener('abort', onAbort);
        this.waiters.delete(wake);
        resolve();
      };
      const onAbort = (): void => {
        this.waiters.delete(wake);
        reject(new HoldAbortedError(signal.reason));
      };
      this.waiters.add(wake);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Clears the hold and wakes every waiting call; returns how many were woken. */
  release(): number {
    this.rule = undefined;
    const woken = [...this.waiters];
    for (const w of woken) w();
    return woken.length;
  }
}
