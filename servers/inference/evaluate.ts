// Expected reward of a policy per taskset: exactly (dynamic programming over the situations) and
// by simulating conversations through `decide`, as the agent would drive it. The reward models
// follow docs/gym-servers.md "Tasks". genrm: genrm_compare's judge scores each answer by its own
// quality whatever its siblings say (distinct answers never tie), so the reward of an answer is
// its quality scaled to [0, 1] (GENRM_ANSWER_QUALITY; cross-checked in the unit test).
import type { ChatMessage } from '../../protocol/openai.js';
import { CITIES, GENRM_TOPICS, genrmPromptId, renderTaskLine, type Taskset, type TaskLine } from '../../protocol/tasks.js';
import { GENRM_ANSWER_QUALITY, genrmAnswerOf } from './answers.js';
import { COUNTER_TOOL, REMAINING_MAX, REMAINING_MIN, WEATHER_TOOL, decide, distributionOf, type PolicyWeights } from './policy.js';

/** Model calls the agent allows per episode (examples/gym.yaml: `max_steps: 8`). */
export const DEFAULT_MAX_STEPS = 8;
/** The dataset's counter tasks: target − start uniform in 2..6. */
const COUNTER_GAPS = [2, 3, 4, 5, 6];

export function genrmScore(action: string): number {
  const q = GENRM_ANSWER_QUALITY[action as keyof typeof GENRM_ANSWER_QUALITY];
  return q === undefined ? 0 : (q - 1) / 4;
}

const clamp = (r: number): number => Math.min(REMAINING_MAX, Math.max(REMAINING_MIN, r));

export function expectedReward(weights: PolicyWeights, taskset: Taskset, maxSteps = DEFAULT_MAX_STEPS): number {
  const dist = (situation: string): [string, number][] => {
    const { actions, logprobs } = distributionOf(weights, situation);
    return actions.map((a, i) => [a, Math.exp(logprobs[i]!)]);
  };
  if (taskset === 'genrm') return dist('genrm').reduce((s, [a, p]) => s + p * genrmScore(a), 0);
  if (taskset === 'counter') {
    // The reward is read from the counter at verify, whether or not the policy answered.
    const value = (r: number, steps: number): number => {
      if (steps === 0) return r === 0 ? 1 : 0;
      return dist(`counter:remaining=${clamp(r)}`).reduce((s, [a, p]) => {
        const k = a === 'inc1' ? 1 : a === 'inc2' ? 2 : a === 'inc3' ? 3 : 0;
        return s + p * (k ? value(r - k, steps - 1) : r === 0 ? 1 : 0);
      }, 0);
    };
    return COUNTER_GAPS.reduce((s, g) => s + value(g, maxSteps), 0) / COUNTER_GAPS.length;
  }
  const value = (calls: number, right: boolean, steps: number): number => {
    if (steps === 0) return right ? 1 : 0;
    return dist(`weather:calls=${calls >= 2 ? '2+' : calls}`).reduce((s, [a, p]) => {
      if (a === 'answer') return s + p * (right ? 1 : 0);
      return s + p * value(calls + 1, right || a === 'call_right_city', steps - 1);
    }, 0);
  };
  return value(0, false, maxSteps);
}

/** A first-turn conversation for a task line, as the dataset writes it. */
function openingMessages(line: TaskLine): ChatMessage[] {
  return [
    { role: 'developer', content: 'You are a helpful assistant.' },
    { role: 'user', content: `Please help.\n${renderTaskLine(line)}` },
  ];
}

/** Mean reward of `n` simulated episodes (rollouts `<prefix>-<i>`) of one taskset. */
export function simulateReward(weights: PolicyWeights, taskset: Taskset, n: number, opts: { maxSteps?: number; salt?: number; prefix?: string } = {}): number {
  const maxSteps = opts.maxSteps ?? DEFAULT_MAX_STEPS;
  let total = 0;
  for (let i = 0; i < n; i++) {
    const rolloutId = `${opts.prefix ?? 'sim'}-${taskset}-${i}`;
    const line: TaskLine =
      taskset === 'counter'
        ? { taskset, start: i % 6, target: (i % 6) + COUNTER_GAPS[i % COUNTER_GAPS.length]! }
        : taskset === 'weather'
          ? { taskset, city: CITIES[i % CITIES.length]! }
          : { taskset, prompt: genrmPromptId(i % GENRM_TOPICS.length) };
    const messages = openingMessages(line);
    let counter = line.taskset === 'counter' ? line.start : 0;
    let rightCity = false;
    let reward = 0;
    for (let step = 0; step < maxSteps; step++) {
      const d = decide({ weights, messages, rolloutId, salt: opts.salt });
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
    total += reward;
  }
  return total / n;
}
