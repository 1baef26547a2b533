// The tiny tabular policy (docs/gym-servers.md "The tiny policy"): the `[task …]` line and the
// conversation so far give a discrete situation; one action is sampled from
// softmax(logits[situation]) with a seed derived from the rollout, the call index and the policy
// version, so a replacement attempt (`r-a1`) makes exactly the calls the original (`r`) made.
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { parseCaptureKey } from '../../protocol/ids.js';
import { contentText, type ChatMessage } from '../../protocol/openai.js';
import { CITIES, parseTaskLine, type TaskLine } from '../../protocol/tasks.js';
import { GENRM_ACTIONS, genrmAnswers } from './answers.js';

export const COUNTER_ACTIONS = ['inc1', 'inc2', 'inc3', 'answer'] as const;
export const WEATHER_ACTIONS = ['call_right_city', 'call_wrong_city', 'answer'] as const;
export { GENRM_ACTIONS };
/** A request without a `[task …]` line: the only thing to do is answer. */
export const NO_TASK_SITUATION = 'none';
const NO_TASK_ACTIONS = ['answer'] as const;

export const REMAINING_MIN = -3;
export const REMAINING_MAX = 6;
const COUNTER_INCREMENT: Readonly<Record<string, number>> = { inc1: 1, inc2: 2, inc3: 3 };

export const COUNTER_TOOL = 'increment_counter';
export const COUNTER_READ_TOOL = 'get_counter_value';
export const WEATHER_TOOL = 'get_weather';

// --- situations -------------------------------------------------------------------------

/** What the policy reads from a request. */
export interface Conversation {
  task: TaskLine | undefined;
  situation: string;
  /** Number of assistant messages already in the request. */
  callIndex: number;
  /** counter: start + the `count` arguments of earlier `increment_counter` calls. */
  current?: number;
  /** weather: earlier `get_weather` calls. */
  weatherCalls?: number;
}

function toolCallsOf(messages: readonly ChatMessage[]): { name: string; arguments: string }[] {
  return messages.filter((m) => m.role === 'assistant').flatMap((m) => (m.tool_calls ?? []).map((c) => c.function));
}

function countArgument(args: string): number {
  try {
    const v = (JSON.parse(args) as { count?: unknown }).count;
    return typeof v === 'number' && Number.isSafeInteger(v) ? v : 0;
  } catch {
    return 0;
  }
}

export function readConversation(messages: readonly ChatMessage[]): Conversation {
  const firstUser = messages.find((m) => m.role === 'user');
  const task = firstUser ? parseTaskLine(contentText(firstUser.content)) : undefined;
  const callIndex = messages.filter((m) => m.role === 'assistant').length;
  const calls = toolCallsOf(messages);
  switch (task?.taskset) {
    case 'counter': {
      const current = task.start + calls.filter((c) => c.name === COUNTER_TOOL).reduce((s, c) => s + countArgument(c.arguments), 0);
      const remaining = Math.min(REMAINING_MAX, Math.max(REMAINING_MIN, task.target - current));
      return { task, situation: `counter:remaining=${remaining}`, callIndex, current };
    }
    case 'weather': {
      const n = calls.filter((c) => c.name === WEATHER_TOOL).length;
      return { task, situation: `weather:calls=${n >= 2 ? '2+' : n}`, callIndex, weatherCalls: n };
    }
    case 'genrm':
      return { task, situation: 'genrm', callIndex };
    default:
      return { task: undefined, situation: NO_TASK_SITUATION, callIndex };
  }
}

export function situationOf(messages: readonly ChatMessage[]): string {
  return readConversation(messages).situation;
}

const COUNTER_SITUATION = /^counter:remaining=(-?\d+)$/;

/** The actions of a situation, in logit order; empty for an unknown situation. */
export function actionsOf(situation: string): readonly string[] {
  const m = COUNTER_SITUATION.exec(situation);
  if (m) {
    const r = Number(m[1]);
    return r >= REMAINING_MIN && r <= REMAINING_MAX && String(r) === m[1] ? COUNTER_ACTIONS : [];
  }
  if (/^weather:calls=(0|1|2\+)$/.test(situation)) return WEATHER_ACTIONS;
  if (situation === 'genrm') return GENRM_ACTIONS;
  if (situation === NO_TASK_SITUATION) return NO_TASK_ACTIONS;
  return [];
}

/** Every situation the policy can be in (except `none`, which has a single action). */
export function allSituations(): string[] {
  const out: string[] = [];
  for (let r = REMAINING_MIN; r <= REMAINING_MAX; r++) out.push(`counter:remaining=${r}`);
  out.push('weather:calls=0', 'weather:calls=1', 'weather:calls=2+', 'genrm');
  return out;
}

// --- weights ----------------------------------------------------------------------------

export interface PolicyWeights {
  version: number;
  /** situation → action → logit; a missing situation or action has logit 0. */
  logits: Record<string, Record<string, number>>;
}

export const PolicyWeightsSchema = z
  .strictObject({
    version: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
    logits: z.record(z.string(), z.record(z.string(), z.number().refine(Number.isFinite, 'logits must be finite'))),
  })
  .superRefine((w, ctx) => {
    for (const [situation, row] of Object.entries(w.logits)) {
      const actions = actionsOf(situation);
      if (!actions.length) {
        ctx.addIssue({ code: 'custom', path: ['logits', situation], message: `unknown situation '${situation}'` });
        continue;
      }
      for (const a of Object.keys(row)) {
        if (!actions.includes(a)) ctx.addIssue({ code: 'custom', path: ['logits', situation, a], message: `unknown action '${a}' for ${situation}` });
      }
    }
  });

/**
 * Mildly wrong starting logits: counter favours +1 steps but often answers too early (and
 * overshoots at 0); weather often calls the wrong city or answers without calling, and after one
 * call it answers; genrm prefers a mediocre answer. Expected reward ≈ 0.3–0.5 (evaluate.ts).
 */
export function initialWeights(): PolicyWeights {
  const logits: Record<string, Record<string, number>> = {};
  for (let r = REMAINING_MIN; r <= REMAINING_MAX; r++) {
    logits[`counter:remaining=${r}`] =
      r > 0
        ? { inc1: 1.5, inc2: 0.2, inc3: -0.5, answer: -0.5 }
        : r === 0
          ? { inc1: 0.2, inc2: -0.8, inc3: -1.2, answer: 1.5 }
          : { inc1: 0.0, inc2: -0.5, inc3: -1.0, answer: 1.0 };
  }
  logits['weather:calls=0'] = { call_right_city: 0.3, call_wrong_city: 0.2, answer: 0.4 };
  logits['weather:calls=1'] = { call_right_city: 0.0, call_wrong_city: -0.3, answer: 1.0 };
  logits['weather:calls=2+'] = { call_right_city: -0.5, call_wrong_city: -0.5, answer: 1.5 };
  logits.genrm = { answer_a: 0.0, answer_b: 0.3, answer_c: 1.0, answer_d: 0.0 };
  return { version: 0, logits };
}

/** log softmax, computed stably (max subtracted). */
export function logSoftmax(logits: readonly number[]): number[] {
  if (!logits.length) return [];
  const max = Math.max(...logits);
  const lse = max + Math.log(logits.reduce((s, x) => s + Math.exp(x - max), 0));
  return logits.map((x) => x - lse);
}

/** The situation's actions with their log probabilities under `weights`. */
export function distributionOf(weights: PolicyWeights, situation: string): { actions: readonly string[]; logprobs: number[] } {
  const actions = actionsOf(situation);
  const row = weights.logits[situation] ?? {};
  return { actions, logprobs: logSoftmax(actions.map((a) => row[a] ?? 0)) };
}

// --- sampling ---------------------------------------------------------------------------

/** The rollout of a capture key: `r-a2` → `r` (a replacement samples like its original). */
export function rolloutIdOf(captureKey: string): string {
  return parseCaptureKey(captureKey)?.rollout_id ?? captureKey;
}

/** SHA-256 of `<rollout_id>:<call index>:<policy version>` (with `<salt>:` in front when a deployment sets one). */
export function sampleSeed(rolloutId: string, callIndex: number, version: number, salt?: number): Buffer {
  const text = `${salt === undefined ? '' : `${salt}:`}${rolloutId}:${callIndex}:${version}`;
  return createHash('sha256').update(text, 'utf8').digest();
}

/** Uniform in [0, 1) from the first 48 bits of the seed. */
function uniformOf(seed: Buffer): number {
  return seed.readUIntBE(0, 6) / 2 ** 48;
}

export function sampleIndex(logprobs: readonly number[], u: number): number {
  let cum = 0;
  for (let i = 0; i < logprobs.length; i++) {
    cum += Math.exp(logprobs[i]!);
    if (u < cum) return i;
  }
  return logprobs.length - 1;
}

export interface PolicyDecision {
  situation: string;
  action: string;
  logprob: number;
  version: number;
  callIndex: number;
  seedHex: string;
  /** The assistant message to return: one tool call, or a final text answer. */
  message: ChatMessage;
  finishReason: 'tool_calls' | 'stop';
}

export interface DecideInput {
  weights: PolicyWeights;
  messages: readonly ChatMessage[];
  /** The rollout ID (attempt suffix already dropped: see `rolloutIdOf`). */
  rolloutId: string;
  salt?: number;
}

export function decide({ weights, messages, rolloutId, salt }: DecideInput): PolicyDecision {
  const conv = readConversation(messages);
  const seed = sampleSeed(rolloutId, conv.callIndex, weights.version, salt);
  const { actions, logprobs } = distributionOf(weights, conv.situation);
  const i = sampleIndex(logprobs, uniformOf(seed));
  const action = actions[i]!;
  const base = { situation: conv.situation, action, logprob: logprobs[i]!, version: weights.version, callIndex: conv.callIndex, seedHex: seed.toString('hex') };
  const toolCall = (name: string, args: unknown): PolicyDecision => ({
    ...base,
    finishReason: 'tool_calls',
    message: {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: `call_${rolloutId}_${conv.callIndex}`, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
    },
  });
  const answer = (text: string): PolicyDecision => ({ ...base, finishReason: 'stop', message: { role: 'assistant', content: text } });

  const task = conv.task;
  if (task?.taskset === 'counter') {
    const k = COUNTER_INCREMENT[action];
    return k ? toolCall(COUNTER_TOOL, { count: k }) : answer(`The counter is at ${conv.current} now.`);
  }
  if (task?.taskset === 'weather') {
    if (action === 'call_right_city') return toolCall(WEATHER_TOOL, { city: task.city });
    if (action === 'call_wrong_city') return toolCall(WEATHER_TOOL, { city: wrongCity(task.city, seed) });
    return answer(conv.weatherCalls ? 'I checked the weather for you.' : `I think the weather in ${task.city} is mild today.`);
  }
  if (task?.taskset === 'genrm') return answer(genrmAnswers(task.prompt)[action as (typeof GENRM_ACTIONS)[number]]);
  return answer('I can only help with requests that end with a [task …] line.');
}

/** A city other than the task's, chosen by the seed (bytes 8–11, independent of the action draw). */
function wrongCity(city: string, seed: Buffer): string {
  const others = CITIES.filter((c) => c !== city);
  return others[seed.readUInt32BE(8) % others.length]!;
}
