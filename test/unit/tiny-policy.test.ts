// The tabular policy: situations, deterministic sampling, logprobs, the weights schema, and the
// expected reward of the initial weights (printed: the numbers the trainer starts from).
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { ChatMessage } from '../../protocol/openai.js';
import { CITIES, type Taskset } from '../../protocol/tasks.js';
import { GENRM_ACTIONS, GENRM_ANSWER_QUALITY, genrmAnswerOf, genrmAnswers } from '../../servers/inference/answers.js';
import { expectedReward, simulateReward } from '../../servers/inference/evaluate.js';
import { answerQuality, cohortRewards } from '../../servers/resources/genrm-judge.js';
import {
  COUNTER_ACTIONS,
  NO_TASK_SITUATION,
  PolicyWeightsSchema,
  WEATHER_ACTIONS,
  actionsOf,
  allSituations,
  decide,
  distributionOf,
  initialWeights,
  logSoftmax,
  readConversation,
  rolloutIdOf,
  sampleSeed,
  situationOf,
  type PolicyWeights,
} from '../../servers/inference/policy.js';

const dev: ChatMessage = { role: 'developer', content: 'You are a helpful assistant.' };
const user = (line: string): ChatMessage => ({ role: 'user', content: `Please.\n${line}` });
const call = (name: string, args: unknown, id = 'c'): ChatMessage => ({
  role: 'assistant',
  content: null,
  tool_calls: [{ id, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
});
const tool = (id = 'c'): ChatMessage => ({ role: 'tool', tool_call_id: id, content: '{"success": true}' });

describe('situations', () => {
  it('counter: remaining = target − (start + earlier increments), clamped to [-3, 6]', () => {
    const base = [dev, user('[task counter start=3 target=6]')];
    expect(situationOf(base)).toBe('counter:remaining=3');
    expect(situationOf([...base, call('increment_counter', { count: 1 }), tool()])).toBe('counter:remaining=2');
    const two = [...base, call('increment_counter', { count: 1 }), tool(), call('increment_counter', { count: 2 }), tool()];
    expect(readConversation(two)).toMatchObject({ situation: 'counter:remaining=0', current: 6, callIndex: 2 });
    // Reads of the counter do not move it; over- and undershoot clamp.
    expect(situationOf([...two, call('get_counter_value', {}), tool()])).toBe('counter:remaining=0');
    expect(situationOf([...base, call('increment_counter', { count: 9 })])).toBe('counter:remaining=-3');
    expect(situationOf([dev, user('[task counter start=0 target=20]')])).toBe('counter:remaining=6');
    // Malformed arguments count as 0.
    const bad: ChatMessage = { role: 'assistant', tool_calls: [{ id: 'x', type: 'function', function: { name: 'increment_counter', arguments: 'nope' } }] };
    expect(situationOf([...base, bad])).toBe('counter:remaining=3');
  });

  it('weather: calls = 0, 1, 2+', () => {
    const base = [dev, user('[task weather city=SF]')];
    expect(situationOf(base)).toBe('weather:calls=0');
    expect(situationOf([...base, call('get_weather', { city: 'SF' }), tool()])).toBe('weather:calls=1');
    const three = [...base, call('get_weather', { city: 'LA' }), tool(), call('get_weather', { city: 'SF' }), tool(), call('get_weather', {}), tool()];
    expect(situationOf(three)).toBe('weather:calls=2+');
    expect(readConversation(three).callIndex).toBe(3);
  });

  it('genrm, and no task line', () => {
    expect(situationOf([user('[task genrm prompt=p17]')])).toBe('genrm');
    expect(situationOf([dev, user('hello')])).toBe(NO_TASK_SITUATION);
    // Content parts work; the task line is read from the first user message only.
    const parts: ChatMessage = {
      role: 'user',
      content: [
        { type: 'text', text: 'Hi ' },
        { type: 'text', text: '[task weather city=LA]' },
      ],
    };
    expect(readConversation([parts, user('[task genrm prompt=p1]')]).task).toEqual({ taskset: 'weather', city: 'LA' });
  });

  it('actions per situation; every situation has initial logits for all its actions', () => {
    expect(actionsOf('counter:remaining=2')).toEqual(COUNTER_ACTIONS);
    expect(actionsOf('counter:remaining=7')).toEqual([]);
    expect(actionsOf('counter:remaining=02')).toEqual([]);
    expect(actionsOf('weather:calls=2+')).toEqual(WEATHER_ACTIONS);
    expect(actionsOf('genrm')).toEqual(GENRM_ACTIONS);
    expect(actionsOf('nope')).toEqual([]);
    const w = initialWeights();
    expect(Object.keys(w.logits).sort()).toEqual(allSituations().sort());
    for (const s of allSituations()) expect(Object.keys(w.logits[s]!).sort()).toEqual([...actionsOf(s)].sort());
    expect(PolicyWeightsSchema.parse(w)).toEqual(w);
  });
});

describe('logSoftmax', () => {
  it('is log of normalised exp, stable for large logits', () => {
    const lp = logSoftmax([1, 2, 3]);
    const z = Math.exp(1) + Math.exp(2) + Math.exp(3);
    for (const [i, v] of lp.entries()) expect(v).toBeCloseTo(Math.log(Math.exp(i + 1) / z), 12);
    const big = logSoftmax([1000, 1000]);
    for (const v of big) expect(v).toBeCloseTo(Math.log(0.5), 12);
    expect(logSoftmax([])).toEqual([]);
  });
});

describe('decide', () => {
  const w = initialWeights();
  const weather = [dev, user('[task weather city=Paris]')];

  it('is deterministic; a replacement attempt samples like its original', () => {
    const a = decide({ weights: w, messages: weather, rolloutId: 'r' });
    expect(decide({ weights: w, messages: weather, rolloutId: 'r' })).toEqual(a);
    expect(rolloutIdOf('r-a1')).toBe('r');
    expect(rolloutIdOf('r-a12')).toBe('r');
    expect(rolloutIdOf('r')).toBe('r');
    expect(decide({ weights: w, messages: weather, rolloutId: rolloutIdOf('r-a1') })).toEqual(a);
    expect(a.seedHex).toBe(sampleSeed('r', 0, 0).toString('hex'));
  });

  it('seed = SHA-256 of <rollout>:<call index>:<version>, salted when a deployment sets a seed', () => {
    expect(sampleSeed('wx-17', 3, 2).toString('hex')).toBe(createHash('sha256').update('wx-17:3:2').digest('hex'));
    expect(sampleSeed('wx-17', 3, 2, 1).toString('hex')).toBe(createHash('sha256').update('1:wx-17:3:2').digest('hex'));
  });

  it('logprob is the log softmax of the situation logits', () => {
    for (let i = 0; i < 30; i++) {
      const d = decide({ weights: w, messages: weather, rolloutId: `lp-${i}` });
      const { actions, logprobs } = distributionOf(w, d.situation);
      expect(d.logprob).toBeCloseTo(logprobs[actions.indexOf(d.action)]!, 12);
      const row = w.logits[d.situation]!;
      expect(d.logprob).toBeCloseTo(logSoftmax(actions.map((a) => row[a]!))[actions.indexOf(d.action)]!, 12);
    }
  });

  it('samples follow the softmax', () => {
    const n = 4000;
    const counts: Record<string, number> = {};
    for (let i = 0; i < n; i++) {
      const d = decide({ weights: w, messages: weather, rolloutId: `freq-${i}` });
      counts[d.action] = (counts[d.action] ?? 0) + 1;
    }
    const { actions, logprobs } = distributionOf(w, 'weather:calls=0');
    for (const [i, a] of actions.entries()) expect(Math.abs((counts[a] ?? 0) / n - Math.exp(logprobs[i]!))).toBeLessThan(0.03);
  });

  it('a new policy version changes the sampling seed', () => {
    const w1: PolicyWeights = { ...w, version: 1 };
    let differ = 0;
    for (let i = 0; i < 40; i++) {
      const a = decide({ weights: w, messages: weather, rolloutId: `v-${i}` });
      const b = decide({ weights: w1, messages: weather, rolloutId: `v-${i}` });
      expect(b.seedHex).not.toBe(a.seedHex);
      expect(b.version).toBe(1);
      if (a.action !== b.action) differ++;
    }
    expect(differ).toBeGreaterThan(0);
  });

  it('builds OpenAI tool calls and answers', () => {
    const force = (situation: string, action: string): PolicyWeights => ({ version: 0, logits: { [situation]: { [action]: 50 } } });
    const counter = [dev, user('[task counter start=1 target=4]')];
    const inc = decide({ weights: force('counter:remaining=3', 'inc2'), messages: counter, rolloutId: 'k' });
    expect(inc.finishReason).toBe('tool_calls');
    expect(inc.message.tool_calls).toEqual([{ id: 'call_k_0', type: 'function', function: { name: 'increment_counter', arguments: '{"count":2}' } }]);
    expect(inc.logprob).toBeCloseTo(0, 9);

    const later = [...weather, call('get_weather', { city: 'Paris' }), tool()];
    const right = decide({ weights: force('weather:calls=1', 'call_right_city'), messages: later, rolloutId: 'k' });
    expect(right.message.tool_calls?.[0]).toMatchObject({ id: 'call_k_1', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } });
    for (let i = 0; i < 20; i++) {
      const wrong = decide({ weights: force('weather:calls=0', 'call_wrong_city'), messages: weather, rolloutId: `k${i}` });
      const city = JSON.parse(wrong.message.tool_calls![0]!.function.arguments).city;
      expect(CITIES).toContain(city);
      expect(city).not.toBe('Paris');
    }
    const ans = decide({ weights: force('weather:calls=0', 'answer'), messages: weather, rolloutId: 'k' });
    expect(ans).toMatchObject({ finishReason: 'stop', message: { role: 'assistant' } });
    expect(typeof ans.message.content).toBe('string');

    const genrm = [user('[task genrm prompt=p5]')];
    for (const a of GENRM_ACTIONS) {
      const d = decide({ weights: force('genrm', a), messages: genrm, rolloutId: 'g' });
      expect(d.message.content).toBe(genrmAnswers('p5')[a]);
      expect(genrmAnswerOf('p5', d.message.content as string)).toBe(a);
    }
    const none = decide({ weights: w, messages: [user('hi')], rolloutId: 'n' });
    expect(none).toMatchObject({ situation: 'none', action: 'answer', logprob: 0, finishReason: 'stop' });
  });

  it('genrm answers have the judge quality they claim, for every prompt', () => {
    for (let k = 0; k < 48; k++) {
      const answers = genrmAnswers(`p${k}`);
      for (const a of GENRM_ACTIONS) expect(answerQuality(answers[a])).toBe(GENRM_ANSWER_QUALITY[a]);
    }
    const a = genrmAnswers('p0');
    expect(new Set(Object.values(a)).size).toBe(4);
    expect(a.answer_a.length).toBeGreaterThan(a.answer_b.length);
    expect(genrmAnswers('p1').answer_a).not.toBe(a.answer_a);
    expect(genrmAnswers('p12').answer_a).toBe(a.answer_a);
  });
});

describe('weights schema', () => {
  it('rejects unknown situations and actions, bad versions and non-finite logits', () => {
    expect(PolicyWeightsSchema.safeParse({ version: 1, logits: {} }).success).toBe(true);
    expect(PolicyWeightsSchema.safeParse({ version: 1, logits: { genrm: { answer_a: 1 } } }).success).toBe(true);
    expect(PolicyWeightsSchema.safeParse({ version: 1, logits: { nope: {} } }).success).toBe(false);
    expect(PolicyWeightsSchema.safeParse({ version: 1, logits: { genrm: { inc1: 1 } } }).success).toBe(false);
    expect(PolicyWeightsSchema.safeParse({ version: -1, logits: {} }).success).toBe(false);
    expect(PolicyWeightsSchema.safeParse({ version: 1.5, logits: {} }).success).toBe(false);
    expect(PolicyWeightsSchema.safeParse({ version: 1, logits: { genrm: { answer_a: Infinity } } }).success).toBe(false);
    expect(PolicyWeightsSchema.safeParse({ version: 1, logits: {}, extra: 1 }).success).toBe(false);
  });
});

describe('expected reward of the initial policy', () => {
  it('starts around 0.3–0.5 per taskset and can rise', () => {
    const w = initialWeights();
    const rows: string[] = [];
    for (const t of ['counter', 'weather', 'genrm'] as Taskset[]) {
      const exact = expectedReward(w, t);
      const sim = simulateReward(w, t, 2000);
      rows.push(`${t.padEnd(8)} exact ${exact.toFixed(3)}  simulated(2000) ${sim.toFixed(3)}`);
      expect(exact).toBeGreaterThanOrEqual(0.3);
      expect(exact).toBeLessThanOrEqual(0.5);
      expect(Math.abs(sim - exact)).toBeLessThan(0.05);
    }
    // genrm through genrm_compare's own cohort scoring (groups of 4, circular pairs).
    let sum = 0;
    let members = 0;
    for (let g = 0; g < 300; g++) {
      const prompt = `p${g % 48}`;
      const texts = [0, 1, 2, 3].map(
        (k) => decide({ weights: w, messages: [user(`[task genrm prompt=${prompt}]`)], rolloutId: `s1-p${g}_g${k}` }).message.content as string,
      );
      for (const r of cohortRewards(texts, 'circular')) {
        sum += r;
        members++;
      }
    }
    const judged = sum / members;
    rows.push(`genrm    judged by genrm_compare (300 groups of 4) ${judged.toFixed(3)}`);
    expect(Math.abs(judged - expectedReward(w, 'genrm'))).toBeLessThan(0.05);
    console.log(`initial policy expected reward (max_steps 8):\n${rows.join('\n')}`);
    // A policy that learned the right moves gets (near) full reward.
    const good = initialWeights();
    for (let r = 1; r <= 6; r++) good.logits[`counter:remaining=${r}`] = { inc1: 8, inc2: 0, inc3: 0, answer: 0 };
    good.logits['counter:remaining=0'] = { inc1: 0, inc2: 0, inc3: 0, answer: 8 };
    good.logits['weather:calls=0'] = { call_right_city: 8, call_wrong_city: 0, answer: 0 };
    good.logits.genrm = { answer_a: 8, answer_b: 0, answer_c: 0, answer_d: 0 };
    for (const t of ['counter', 'weather', 'genrm'] as Taskset[]) expect(expectedReward(good, t)).toBeGreaterThan(0.98);
  });
});
