// The deterministic GenRM judge of `genrm_compare` (participants.md §4.10 steps 1–4), standing in
// for a judge model: a pure function of the two answers' texts, so a cohort re-formed from
// replayed verifies after a crash gets exactly the same rewards.
//
// The rule (hash-free, documented so the policy side can produce answers of known quality):
//   quality(text) = 1 + the number of distinct markers among
//                   "because", "for example", "therefore", "in summary"
//                   found in the text (case-insensitive), so 1 … 5;
//   a pair's scores are the two qualities; `ranking` (1 = response_1 much better … 6 = response_2
//   much better) follows the quality gap, and on equal quality prefers the shorter answer
//   (3 or 4; 3.5 when the lengths are equal too), which the tiebreak turns into ±0.5.
// `GENRM_ANSWERS` are four canonical answers with qualities 5, 3, 2 and 1 (`answer_a` best) that
// the tiny policy's actions `answer_a` … `answer_d` can emit verbatim.

export const JUDGE_MARKERS = ['because', 'for example', 'therefore', 'in summary'] as const;

export const GENRM_ANSWERS = {
  answer_a:
    'The claim holds because every step follows from the one before; for example, step two reuses the result of step one. Therefore the conclusion is sound. In summary: yes.',
  answer_b: 'The claim holds because every step follows from the one before. Therefore the answer is yes.',
  answer_c: 'The claim holds because it looks right. Yes.',
  answer_d: 'Yes.',
} as const;

export const DEFAULT_SCORE = 3.0;
export const DEFAULT_RANKING = 3.5;

export type Comparison = 'circular' | 'all_pairs';

export interface PairJudgement {
  score_1: number;
  score_2: number;
  ranking: number;
}

export function answerQuality(text: string): number {
  const t = text.toLowerCase();
  let q = 1;
  for (const m of JUDGE_MARKERS) if (t.includes(m)) q += 1;
  return q;
}

export function judgePair(response1: string, response2: string): PairJudgement {
  const score_1 = answerQuality(response1);
  const score_2 = answerQuality(response2);
  const gap = score_1 - score_2;
  let ranking: number;
  if (gap >= 2) ranking = 1;
  else if (gap === 1) ranking = 2;
  else if (gap === -1) ranking = 5;
  else if (gap <= -2) ranking = 6;
  else if (response1.length < response2.length) ranking = 3;
  else if (response1.length > response2.length) ranking = 4;
  else ranking = DEFAULT_RANKING;
  return { score_1, score_2, ranking };
}

/** `simple_tiebreaker`: equal scores are split by the ranking's distance from neutral. */
export function tiebreak(j: PairJudgement): [number, number] {
  if (j.score_1 !== j.score_2) return [j.score_1, j.score_2];
  const d = DEFAULT_RANKING - j.ranking;
  return [j.score_1 + d, j.score_2 - d];
}

/** Step 1: `circular` → (i, i+1 mod N) for every i; `all_pairs` → every i < j. Fewer than 2 → none. */
export function comparisonPairs(n: number, comparison: Comparison): Array<[number, number]> {
  const pairs: Array<[number, number]> = [];
  if (n < 2) return pairs;
  if (comparison === 'circular') for (let i = 0; i < n; i++) pairs.push([i, (i + 1) % n]);
  else for (let i = 0; i < n; i++) for (let j = i + 1; j < n; j++) pairs.push([i, j]);
  return pairs;
}

/**
 * Steps 2–4 plus the scaling our tasks use: each member's mean adjusted score over its
 * comparisons (`DEFAULT_SCORE` without any), mapped from 1…5 to [0, 1].
 */
export function cohortRewards(texts: readonly string[], comparison: Comparison): number[] {
  const received: number[][] = texts.map(() => []);
  for (const [i, j] of comparisonPairs(texts.length, comparison)) {
    const [s1, s2] = tiebreak(judgePair(texts[i]!, texts[j]!));
    received[i]!.push(s1);
    received[j]!.push(s2);
  }
  return received.map((scores) => {
    const mean = scores.length ? scores.reduce((a, b) => a + b, 0) / scores.length : DEFAULT_SCORE;
    return Math.min(1, Math.max(0, (mean - 1) / 4));
  });
}

/** The answer a verify body carries: the assistant messages' output text, joined. */
export function answerText(response: unknown): string {
  const output = (response as { output?: unknown } | undefined)?.output;
  if (!Array.isArray(output)) return '';
  const parts: string[] = [];
  for (const item of output) {
    if (!item || typeof item !== 'object' || (item as { type?: unknown }).type !== 'message') continue;
    const content = (item as { content?: unknown }).content;
    if (typeof content === 'string') parts.push(content);
    else if (Array.isArray(content)) {
      for (const c of content) {
        const text = (c as { text?: unknown } | null)?.text;
        if (typeof text === 'string') parts.push(text);
      }
    }
  }
  return parts.join('\n');
}
