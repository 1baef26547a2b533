// GRPO for the tiny tabular policy: group advantages, the softmax policy gradient (checked against
// finite differences), the lazy Adam step, determinism, and a simulated training loop whose
// expected reward (servers/inference/evaluate.ts) rises over 10 steps of 4 groups × 4 siblings.
import { describe, expect, it } from 'vitest';
import {
  ADVANTAGE_EPS,
  adamStep,
  groupAdvantages,
  grpoStep,
  initialOptimizer,
  policyGradient,
  probabilitiesOf,
  type GrpoCall,
  type GrpoGroup,
  type Table,
} from '../../activities/grpo.js';
import type { ChatMessage } from '../../protocol/openai.js';
import { CITIES, TASKSETS, genrmPromptId, renderTaskLine, type TaskLine } from '../../protocol/tasks.js';
import { genrmAnswerOf } from '../../servers/inference/answers.js';
import { DEFAULT_MAX_STEPS, expectedReward, genrmScore } from '../../servers/inference/evaluate.js';
import { COUNTER_TOOL, WEATHER_TOOL, decide, distributionOf, initialWeights, type PolicyWeights } from '../../servers/inference/policy.js';

const sib = (reward: number, calls: GrpoCall[] = [], mask = false) => ({ reward, mask, calls });

describe('groupAdvantages', () => {
  it('(r − mean) / (std + 1e-6) over the unmasked siblings, population std', () => {
    const a = groupAdvantages([sib(1), sib(0), sib(0), sib(1)]);
    // mean 0.5, std 0.5
    for (const [i, want] of [1, -1, -1, 1].entries()) expect(a[i]).toBeCloseTo(want * (0.5 / (0.5 + ADVANTAGE_EPS)), 12);
    const b = groupAdvantages([sib(1), sib(0), sib(0), sib(0)]);
    const std = Math.sqrt(0.1875);
    expect(b[0]).toBeCloseTo(0.75 / (std + ADVANTAGE_EPS), 12);
    expect(b[1]).toBeCloseTo(-0.25 / (std + ADVANTAGE_EPS), 12);
    expect(b.reduce((s, x) => s + x, 0)).toBeCloseTo(0, 12);
  });

  it('masked siblings get 0 and stay out of the baseline', () => {
    const a = groupAdvantages([sib(1), sib(0), sib(0, [], true), sib(0.5, [], true)]);
    expect(a[2]).toBe(0);
    expect(a[3]).toBe(0);
    expect(a[0]).toBeCloseTo(1 / (1 + 2 * ADVANTAGE_EPS), 9);
    expect(a[1]).toBeCloseTo(-a[0]!, 12);
  });

  it('a group whose rewards are all equal (or with one live sibling) contributes exactly nothing', () => {
    expect(groupAdvantages([sib(0.1), sib(0.1), sib(0.1)])).toEqual([0, 0, 0]);
    expect(groupAdvantages([sib(1), sib(1)])).toEqual([0, 0]);
    expect(groupAdvantages([sib(1), sib(0, [], true)])).toEqual([0, 0]);
    expect(groupAdvantages([])).toEqual([]);
  });
});

describe('policyGradient', () => {
  const logits = initialWeights().logits;
  const groups: GrpoGroup[] = [
    {
      siblings: [
        sib(1, [
          { situation: 'counter:remaining=2', action: 'inc2' },
          { situation: 'counter:remaining=0', action: 'answer' },
        ]),
        sib(0, [{ situation: 'counter:remaining=2', action: 'answer' }]),
        sib(0, [
          { situation: 'counter:remaining=2', action: 'inc1' },
          { situation: 'counter:remaining=1', action: 'answer' },
        ]),
      ],
    },
    {
      siblings: [
        sib(0.75, [{ situation: 'genrm', action: 'answer_b' }]),
        sib(1, [{ situation: 'genrm', action: 'answer_a' }]),
        sib(0, [{ situation: 'genrm', action: 'answer_d' }], true),
      ],
    },
    // Equal rewards: calls count in the average but push nothing.
    { siblings: [sib(1, [{ situation: 'weather:calls=0', action: 'call_right_city' }]), sib(1, [{ situation: 'weather:calls=0', action: 'answer' }])] },
  ];
  const advantages = groups.map((g) => groupAdvantages(g.siblings));

  /** J(θ) = (1/N) Σ A Σ log π(a|s), the objective the gradient is of. */
  function objective(l: Table): number {
    let j = 0;
    let n = 0;
    for (const [gi, g] of groups.entries()) {
      for (const [si, s] of g.siblings.entries()) {
        if (s.mask) continue;
        for (const c of s.calls) {
          const { actions, logprobs } = distributionOf({ version: 0, logits: l }, c.situation);
          j += advantages[gi]![si]! * logprobs[actions.indexOf(c.action)]!;
          n += 1;
        }
      }
    }
    return j / n;
  }

  it('each situation row sums to zero; unmasked calls are averaged', () => {
    const { gradient, usedCalls, unknownCalls } = policyGradient(logits, groups, advantages);
    expect(usedCalls).toBe(9); // 5 + 2 + 2: the masked sibling's call is out
    expect(unknownCalls).toBe(0);
    expect(Object.keys(gradient)).toEqual(['counter:remaining=0', 'counter:remaining=1', 'counter:remaining=2', 'genrm', 'weather:calls=0']);
    for (const row of Object.values(gradient)) expect(Object.values(row).reduce((s, x) => s + x, 0)).toBeCloseTo(0, 14);
    expect(Object.values(gradient['weather:calls=0']!).every((x) => x === 0)).toBe(true);
    // The winning sibling's action is pushed up, the losers' down.
    expect(gradient['counter:remaining=2']!.inc2!).toBeGreaterThan(0);
    expect(gradient['counter:remaining=2']!.answer!).toBeLessThan(0);
    expect(gradient.genrm!.answer_a!).toBeGreaterThan(0);
    expect(gradient.genrm!.answer_b!).toBeLessThan(0);
  });

  it('equals ∂J/∂logit by finite differences (∂ log π(a|s)/∂ logit[s][b] = 1[b=a] − π(b|s))', () => {
    const { gradient } = policyGradient(logits, groups, advantages);
    const h = 1e-6;
    for (const [situation, row] of Object.entries(gradient)) {
      for (const action of Object.keys(row)) {
        const bump = (d: number): Table => ({ ...logits, [situation]: { ...logits[situation], [action]: (logits[situation]?.[action] ?? 0) + d } });
        const numeric = (objective(bump(h)) - objective(bump(-h))) / (2 * h);
        expect(row[action]!).toBeCloseTo(numeric, 7);
      }
    }
  });

  it('skips calls the policy does not know', () => {
    const g: GrpoGroup[] = [
      {
        siblings: [
          sib(1, [
            { situation: 'chess', action: 'e4' },
            { situation: 'genrm', action: 'answer_z' },
          ]),
          sib(0, [{ situation: 'genrm', action: 'answer_a' }]),
        ],
      },
    ];
    const r = policyGradient(
      logits,
      g,
      g.map((x) => groupAdvantages(x.siblings)),
    );
    expect(r.unknownCalls).toBe(2);
    expect(r.usedCalls).toBe(1);
    expect(Object.keys(r.gradient)).toEqual(['genrm']);
  });
});

describe('adamStep', () => {
  it('first step moves each coordinate by ≈ lr · sign(g); untouched situations keep logits and moments', () => {
    const logits = initialWeights().logits;
    const opt = initialOptimizer({ lr: 0.5 });
    const gradient: Table = {
      genrm: { answer_a: 0.3, answer_b: -0.1, answer_c: -0.2, answer_d: 0 },
      'weather:calls=1': { call_right_city: 0, call_wrong_city: 0, answer: 0 },
    };
    const r = adamStep(logits, opt, gradient);
    expect(r.updated).toEqual(['genrm']);
    expect(r.optimizer.t).toBe(1);
    expect(r.logits.genrm!.answer_a).toBeCloseTo(logits.genrm!.answer_a! + 0.5, 6);
    expect(r.logits.genrm!.answer_b).toBeCloseTo(logits.genrm!.answer_b! - 0.5, 6);
    expect(r.logits.genrm!.answer_c).toBeCloseTo(logits.genrm!.answer_c! - 0.5, 6);
    expect(r.logits.genrm!.answer_d).toBe(logits.genrm!.answer_d);
    expect(r.logits['weather:calls=1']).toEqual(logits['weather:calls=1']);
    expect(Object.keys(r.optimizer.m)).toEqual(['genrm']);
    expect(r.optimizer.m.genrm!.answer_a).toBeCloseTo(0.03, 15);
    expect(r.optimizer.v.genrm!.answer_a).toBeCloseTo(0.001 * 0.09, 15);
    // Inputs are not mutated.
    expect(logits).toEqual(initialWeights().logits);
    expect(opt.t).toBe(0);
  });

  it('second step follows the Adam recurrences with bias correction', () => {
    const opt = initialOptimizer({ lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8 });
    const g1: Table = { genrm: { answer_a: 1, answer_b: -1, answer_c: 0, answer_d: 0 } };
    const g2: Table = { genrm: { answer_a: 0.5, answer_b: 0.5, answer_c: -1, answer_d: 0 } };
    const s1 = adamStep({ genrm: { answer_a: 0, answer_b: 0, answer_c: 0, answer_d: 0 } }, opt, g1);
    const s2 = adamStep(s1.logits, s1.optimizer, g2);
    const expectCoord = (g1x: number, g2x: number): number => {
      let m = 0.1 * g1x;
      let v = 0.001 * g1x * g1x;
      let x = g1x === 0 ? 0 : (0.1 * (m / 0.1)) / (Math.sqrt(v / 0.001) + 1e-8);
      m = 0.9 * m + 0.1 * g2x;
      v = 0.999 * v + 0.001 * g2x * g2x;
      const c1 = 1 - 0.9 ** 2;
      const c2 = 1 - 0.999 ** 2;
      x += (0.1 * (m / c1)) / (Math.sqrt(v / c2) + 1e-8);
      return x;
    };
    expect(s2.optimizer.t).toBe(2);
    expect(s2.logits.genrm!.answer_a).toBeCloseTo(expectCoord(1, 0.5), 12);
    expect(s2.logits.genrm!.answer_b).toBeCloseTo(expectCoord(-1, 0.5), 12);
    expect(s2.logits.genrm!.answer_c).toBeCloseTo(expectCoord(0, -1), 12);
    expect(s2.logits.genrm!.answer_d).toBe(0);
  });

  it('rejects bad hyperparameters', () => {
    expect(() => initialOptimizer({ lr: 0 })).toThrow(/lr/);
    expect(() => initialOptimizer({ beta1: 1 })).toThrow(/beta1/);
    expect(() => initialOptimizer({ eps: -1 })).toThrow(/eps/);
  });
});

// --- a simulated training loop ---------------------------------------------------------------

/** Task i of the simulated dataset: tasksets interleaved, counter gaps 2..6 as the dataset's. */
function taskLine(i: number): TaskLine {
  const taskset = TASKSETS[i % TASKSETS.length]!;
  const k = Math.floor(i / TASKSETS.length);
  if (taskset === 'counter') return { taskset, start: k % 6, target: (k % 6) + 2 + ((k * 7) % 5) };
  if (taskset === 'weather') return { taskset, city: CITIES[(k * 3) % CITIES.length]! };
  return { taskset, prompt: genrmPromptId(k % 48) };
}

/** One episode as the agent and resources would run it; the calls are what the call log would hold. */
function episode(weights: PolicyWeights, line: TaskLine, rolloutId: string): { reward: number; calls: GrpoCall[] } {
  const messages: ChatMessage[] = [
    { role: 'developer', content: 'You are a helpful assistant.' },
    { role: 'user', content: `Please help.\n${renderTaskLine(line)}` },
  ];
  let counter = line.taskset === 'counter' ? line.start : 0;
  let rightCity = false;
  let reward = 0;
  const calls: GrpoCall[] = [];
  for (let step = 0; step < DEFAULT_MAX_STEPS; step++) {
    const d = decide({ weights, messages, rolloutId });
    calls.push({ situation: d.situation, action: d.action });
    messages.push(d.message);
    const call = d.message.tool_calls?.[0];
    if (!call) {
      if (line.taskset === 'genrm') reward = genrmScore(genrmAnswerOf(line.prompt, String(d.message.content)) ?? '');
      break;
    }
    const args = JSON.parse(call.function.arguments) as { count?: number; city?: string };
    if (call.function.name === COUNTER_TOOL) counter += args.count ?? 0;
    if (call.function.name === WEATHER_TOOL && line.taskset === 'weather' && args.city === line.city) rightCity = true;
    messages.push({ role: 'tool', tool_call_id: call.id, content: '{"success": true}' });
  }
  if (line.taskset === 'counter') reward = counter === line.target ? 1 : 0;
  if (line.taskset === 'weather') reward = rightCity ? 1 : 0;
  return { reward, calls };
}

const meanExpected = (w: PolicyWeights): number => TASKSETS.reduce((s, t) => s + expectedReward(w, t), 0) / TASKSETS.length;

/** `steps` GRPO steps of `groups` × `size`; the expected reward after each (index 0: before). */
function train(run: string, steps: number, groups = 4, size = 4, lr?: number): { curve: number[]; weights: PolicyWeights } {
  let weights = initialWeights();
  let optimizer = initialOptimizer(lr === undefined ? {} : { lr });
  const curve = [meanExpected(weights)];
  let cursor = 0;
  for (let s = 1; s <= steps; s++) {
    const batch: GrpoGroup[] = [];
    for (let g = 0; g < groups; g++, cursor++) {
      const line = taskLine(cursor);
      batch.push({ siblings: Array.from({ length: size }, (_, k) => ({ ...episode(weights, line, `${run}-g${cursor}-${k}`), mask: false })) });
    }
    const r = grpoStep({ logits: weights.logits, optimizer, groups: batch });
    weights = { version: weights.version + 1, logits: r.logits };
    optimizer = r.optimizer;
    curve.push(meanExpected(weights));
  }
  return { curve, weights };
}

describe('grpoStep', () => {
  it('is deterministic: the same batch on the same state gives bit-identical weights', () => {
    const w = initialWeights();
    const batch: GrpoGroup[] = [0, 1, 2, 3].map((g) => ({
      siblings: [0, 1, 2, 3].map((k) => ({ ...episode(w, taskLine(g), `det-${g}-${k}`), mask: k === 3 && g === 0 })),
    }));
    const a = grpoStep({ logits: w.logits, optimizer: initialOptimizer(), groups: batch });
    const b = grpoStep({ logits: structuredClone(w.logits), optimizer: initialOptimizer(), groups: structuredClone(batch) });
    expect(JSON.stringify(b)).toBe(JSON.stringify(a));
    expect(a.usedCalls).toBeGreaterThan(0);
    // Probabilities stay a distribution.
    for (const s of a.updated) expect(probabilitiesOf(a.logits, s).probs.reduce((x, y) => x + y, 0)).toBeCloseTo(1, 12);
  });

  it('learns: the expected reward rises over 10 steps of 4 groups × 4 siblings (lr 0.5)', () => {
    const curves = ['sim-a', 'sim-b', 'sim-c'].map((run) => train(run, 10).curve);
    for (const [i, c] of curves.entries()) console.log(`expected reward, run ${i}: ${c.map((x) => x.toFixed(3)).join(' → ')}`);
    for (const c of curves) {
      expect(c[0]).toBeLessThan(0.45);
      expect(c[5]!).toBeGreaterThan(c[0]! + 0.15);
      expect(c[10]!).toBeGreaterThan(c[0]! + 0.35);
      expect(c[10]!).toBeGreaterThan(0.8);
    }
  });
});
