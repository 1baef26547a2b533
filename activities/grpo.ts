// GRPO for the tiny tabular policy (docs/gym-servers.md "The tiny policy"), pure and deterministic:
// group-normalised advantages, the policy gradient of softmax(logits[situation]), and an Adam step.
// No I/O: activities/trainer.ts loads the calls and keeps the state. Every loop runs in a fixed
// order (groups, siblings, calls as given; situations and actions sorted) so the same batch on the
// same state gives bit-identical weights — a re-sent batch after a trainer restore reproduces the
// lost step exactly.
import { actionsOf, logSoftmax } from '../servers/inference/policy.js';

/** situation → action → number (logits, gradients, Adam moments). */
export type Table = Record<string, Record<string, number>>;

export const DEFAULT_LEARNING_RATE = 0.5;
export const DEFAULT_BETA1 = 0.9;
export const DEFAULT_BETA2 = 0.999;
export const DEFAULT_EPS = 1e-8;
/** Added to the group's standard deviation (the GRPO normalisation). */
export const ADVANTAGE_EPS = 1e-6;

export interface AdamState {
  kind: 'adam';
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  /** Optimizer steps taken (bias correction uses it). */
  t: number;
  /** First and second moments, only for situations a step has touched. */
  m: Table;
  v: Table;
}

export interface AdamOptions {
  lr?: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
}

export function initialOptimizer(opts: AdamOptions = {}): AdamState {
  const o: AdamState = {
    kind: 'adam',
    lr: opts.lr ?? DEFAULT_LEARNING_RATE,
    beta1: opts.beta1 ?? DEFAULT_BETA1,
    beta2: opts.beta2 ?? DEFAULT_BETA2,
    eps: opts.eps ?? DEFAULT_EPS,
    t: 0,
    m: {},
    v: {},
  };
  const bad = checkOptimizer(o);
  if (bad) throw new RangeError(bad);
  return o;
}

/** A problem with the hyperparameters, or undefined. */
export function checkOptimizer(o: AdamState): string | undefined {
  if (!(Number.isFinite(o.lr) && o.lr > 0)) return `lr must be a positive number (got ${o.lr})`;
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return `beta1 must be in [0, 1) (got ${o.beta1})`;
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return `beta2 must be in [0, 1) (got ${o.beta2})`;
  if (!(Number.isFinite(o.eps) && o.eps > 0)) return `eps must be a positive number (got ${o.eps})`;
  if (!(Number.isSafeInteger(o.t) && o.t >= 0)) return `t must be an integer ≥ 0 (got ${o.t})`;
  return undefined;
}

// --- batch ------------------------------------------------------------------------------------

export interface GrpoCall {
  situation: string;
  action: string;
}

export interface GrpoSibling {
  reward: number;
  /** Masked siblings (given-up placeholders) take no part in the baseline or the gradient. */
  mask: boolean;
  /** The model calls of the sibling's trajectory, in order. */
  calls: readonly GrpoCall[];
}

export interface GrpoGroup {
  siblings: readonly GrpoSibling[];
}

// --- advantages -------------------------------------------------------------------------------

/**
 * `(r − mean) / (std + 1e-6)` over the unmasked siblings of one group (population std); masked
 * siblings get 0. A group whose unmasked rewards are all equal (or with fewer than two) gets all
 * zeros exactly, not float dust: it carries no signal about which actions were better.
 */
export function groupAdvantages(siblings: readonly Pick<GrpoSibling, 'reward' | 'mask'>[]): number[] {
  const live = siblings.filter((s) => !s.mask).map((s) => s.reward);
  const out = siblings.map(() => 0);
  if (live.length < 2 || live.every((r) => r === live[0])) return out;
  const mean = live.reduce((a, r) => a + r, 0) / live.length;
  const std = Math.sqrt(live.reduce((a, r) => a + (r - mean) ** 2, 0) / live.length);
  siblings.forEach((s, i) => {
    if (!s.mask) out[i] = (s.reward - mean) / (std + ADVANTAGE_EPS);
  });
  return out;
}

// --- policy gradient --------------------------------------------------------------------------

/** The situation's actions with their probabilities under `logits` (missing logits are 0). */
export function probabilitiesOf(logits: Table, situation: string): { actions: readonly string[]; probs: number[] } {
  const actions = actionsOf(situation);
  const row = logits[situation] ?? {};
  return { actions, probs: logSoftmax(actions.map((a) => row[a] ?? 0)).map(Math.exp) };
}

export interface PolicyGradient {
  /** ∇ of the objective (ascend it); only situations with at least one used call. */
  gradient: Table;
  /** Calls of unmasked siblings that entered the average. */
  usedCalls: number;
  /** Calls whose situation or action the policy does not know (skipped). */
  unknownCalls: number;
}

/**
 * ∇_θ J with J = (1/N) Σ_siblings A_i Σ_calls log π(a|s), N = the used calls of the batch (a
 * token-mean, as GRPO averages its loss over tokens). For the tabular softmax
 * ∂ log π(a|s) / ∂ logit[s][b] = 1[b = a] − π(b|s), so each situation's gradient row sums to zero.
 */
export function policyGradient(logits: Table, groups: readonly GrpoGroup[], advantages: readonly (readonly number[])[]): PolicyGradient {
  const sum: Table = {};
  let usedCalls = 0;
  let unknownCalls = 0;
  groups.forEach((g, gi) => {
    g.siblings.forEach((s, si) => {
      if (s.mask) return;
      const adv = advantages[gi]?.[si] ?? 0;
      for (const c of s.calls) {
        const { actions, probs } = probabilitiesOf(logits, c.situation);
        const ai = actions.indexOf(c.action);
        if (ai < 0) {
          unknownCalls += 1;
          continue;
        }
        usedCalls += 1;
        const row = (sum[c.situation] ??= Object.fromEntries(actions.map((a) => [a, 0])));
        actions.forEach((b, bi) => {
          row[b] = row[b]! + adv * ((bi === ai ? 1 : 0) - probs[bi]!);
        });
      }
    });
  });
  const gradient: Table = {};
  for (const situation of Object.keys(sum).sort()) {
    const row = sum[situation]!;
    gradient[situation] = Object.fromEntries(
      Object.keys(row)
        .sort()
        .map((a) => [a, usedCalls ? row[a]! / usedCalls : 0]),
    );
  }
  return { gradient, usedCalls, unknownCalls };
}

// --- Adam -------------------------------------------------------------------------------------

const copyTable = (t: Table): Table => Object.fromEntries(Object.entries(t).map(([s, row]) => [s, { ...row }]));

/** Keys sorted at both levels, so the state serialises the same way every time. */
export function sortedTable(t: Table): Table {
  return Object.fromEntries(
    Object.keys(t)
      .sort()
      .map((s) => [
        s,
        Object.fromEntries(
          Object.keys(t[s]!)
            .sort()
            .map((a) => [a, t[s]![a]!]),
        ),
      ]),
  );
}

export interface AdamStepResult {
  logits: Table;
  optimizer: AdamState;
  /** Situations whose logits moved (sorted). */
  updated: string[];
}

/**
 * One Adam ascent step `θ += lr · m̂ / (√v̂ + eps)`, lazily: only situations with a non-zero
 * gradient row update their moments and logits (a situation no rollout visited keeps its logits
 * instead of drifting on stale momentum). `t` counts optimizer steps, as sparse Adam does.
 */
export function adamStep(logits: Table, optimizer: AdamState, gradient: Table): AdamStepResult {
  const t = optimizer.t + 1;
  const { lr, beta1, beta2, eps } = optimizer;
  const c1 = 1 - beta1 ** t;
  const c2 = 1 - beta2 ** t;
  const next = copyTable(logits);
  const m = copyTable(optimizer.m);
  const v = copyTable(optimizer.v);
  const updated: string[] = [];
  for (const situation of Object.keys(gradient).sort()) {
    const g = gradient[situation]!;
    const actions = actionsOf(situation);
    if (!actions.some((a) => (g[a] ?? 0) !== 0)) continue;
    const row = (next[situation] ??= {});
    const mr = (m[situation] ??= {});
    const vr = (v[situation] ??= {});
    for (const a of actions) {
      const ga = g[a] ?? 0;
      mr[a] = beta1 * (mr[a] ?? 0) + (1 - beta1) * ga;
      vr[a] = beta2 * (vr[a] ?? 0) + (1 - beta2) * ga * ga;
      row[a] = (row[a] ?? 0) + (lr * (mr[a]! / c1)) / (Math.sqrt(vr[a]! / c2) + eps);
    }
    updated.push(situation);
  }
  return { logits: sortedTable(next), optimizer: { ...optimizer, t, m: sortedTable(m), v: sortedTable(v) }, updated };
}

// --- one GRPO step ----------------------------------------------------------------------------

export interface GrpoStepInput {
  logits: Table;
  optimizer: AdamState;
  groups: readonly GrpoGroup[];
}

export interface GrpoStepResult extends AdamStepResult {
  advantages: number[][];
  /** Mean reward of the unmasked siblings (0 when there are none). */
  meanReward: number;
  /** Groups with at least one non-zero advantage. */
  contributingGroups: number;
  usedCalls: number;
  unknownCalls: number;
}

/** Advantages → gradient → Adam step. The caller bumps the policy version. */
export function grpoStep({ logits, optimizer, groups }: GrpoStepInput): GrpoStepResult {
  const advantages = groups.map((g) => groupAdvantages(g.siblings));
  let sum = 0;
  let n = 0;
  for (const g of groups) {
    for (const s of g.siblings) {
      if (s.mask) continue;
      sum += s.reward;
      n += 1;
    }
  }
  const pg = policyGradient(logits, groups, advantages);
  const step = adamStep(logits, optimizer, pg.gradient);
  return {
    ...step,
    advantages,
    meanReward: n ? sum / n : 0,
    contributingGroups: advantages.filter((a) => a.some((x) => x !== 0)).length,
    usedCalls: pg.usedCalls,
    unknownCalls: pg.unknownCalls,
  };
}
