// The four fixed answers the tiny policy can give to each genrm prompt, from best (`answer_a`) to
// worst (`answer_d`). Their quality is what genrm_compare's deterministic judge measures
// (servers/resources/genrm-judge.ts: 1 + the distinct markers "because", "for example",
// "therefore", "in summary"): answer_a carries all four (5), answer_b two (3), answer_c one (2),
// answer_d none (1). The facts around the markers make the better answers read better too.
import { GENRM_TOPICS, genrmTopicIndex } from '../../protocol/tasks.js';

export const GENRM_ACTIONS = ['answer_a', 'answer_b', 'answer_c', 'answer_d'] as const;
export type GenrmAction = (typeof GENRM_ACTIONS)[number];

/** The judge's score (1–5) of each answer; `answer_a` is the best. */
export const GENRM_ANSWER_QUALITY: Readonly<Record<GenrmAction, number>> = {
  answer_a: 5,
  answer_b: 3,
  answer_c: 2,
  answer_d: 1,
};

/** Per topic: a correct core statement, a sentence that adds why or how, and an example. */
const FACTS: Readonly<Record<(typeof GENRM_TOPICS)[number], readonly [string, string, string]>> = {
  photosynthesis: [
    'Plants use the energy of sunlight to turn water and carbon dioxide into glucose, releasing oxygen.',
    'It happens in the chloroplasts, and it is the source of almost all the chemical energy in food chains.',
    'a leaf turning sunlight into the sugar a tree grows on',
  ],
  'ocean tides': [
    "Tides are the regular rise and fall of sea level caused mainly by the Moon's gravity pulling on the oceans.",
    'The Earth turns under two tidal bulges, so most coasts see two high tides a day, larger when Sun and Moon align.',
    'the high tide that returns about every 12 hours and 25 minutes',
  ],
  rainbows: [
    'A rainbow appears when sunlight is refracted, reflected and dispersed inside raindrops, splitting white light into colours.',
    'You see it with the Sun behind you, at about 42 degrees from the point opposite the Sun.',
    'the bow in the spray of a garden hose with the Sun behind you',
  ],
  inflation: [
    'Inflation is the general rise of prices over time, so each unit of money buys less.',
    'Central banks usually aim for a low, stable rate, since high or volatile inflation erodes savings and planning.',
    'a loaf of bread that cost 2 dollars and now costs 3',
  ],
  vaccines: [
    'A vaccine trains the immune system with a harmless form or part of a germ, so it remembers it.',
    'If the real germ arrives later, the body responds faster and stronger, which prevents or softens the illness.',
    'the measles vaccine, which protects most people for life',
  ],
  'compound interest': [
    'Compound interest is interest earned on both the original amount and on the interest already added.',
    'As the base grows each period, savings grow exponentially: 5% a year roughly doubles money in 14 years.',
    '100 dollars at 10% becoming 110, then 121, then 133.10',
  ],
  'the seasons': [
    "Seasons come from the tilt of Earth's axis, about 23.4 degrees, not from its distance to the Sun.",
    'The hemisphere tilted toward the Sun gets more direct light and longer days, so it has summer.',
    'June being summer in Europe but winter in Australia',
  ],
  recursion: [
    'Recursion is when a function solves a problem by calling itself on smaller instances of the same problem.',
    'It needs a base case that stops the calls; factorial and tree traversal are classic examples.',
    'factorial(n) = n * factorial(n - 1), with factorial(0) = 1',
  ],
  'hash tables': [
    'A hash table stores key-value pairs in an array, using a hash function to compute the slot for each key.',
    'Lookups, inserts and deletes take constant time on average, as long as collisions are handled and the load stays low.',
    "a dictionary that finds a word's entry without scanning every page",
  ],
  'plate tectonics': [
    "Plate tectonics says Earth's outer shell is broken into plates that slowly move over the hotter mantle.",
    'Where plates meet they cause earthquakes, volcanoes and mountain ranges, and they move a few centimetres a year.',
    'the Himalayas, pushed up where the Indian plate meets Asia',
  ],
  'the water cycle': [
    'In the water cycle, water evaporates, condenses into clouds, falls as precipitation and flows back to the sea.',
    "The Sun's heat drives it, and it moves fresh water between oceans, air, land and living things.",
    'a puddle that dries up and later falls again as rain',
  ],
  'supply and demand': [
    'Supply and demand says prices settle where the quantity buyers want equals the quantity sellers offer.',
    'When demand rises or supply falls, the price goes up until the two balance again.',
    'concert tickets whose resale price jumps when a show sells out',
  ],
};

/** The four answer texts for a prompt, best first; unknown prompt IDs get topic-free answers. */
export function genrmAnswers(promptId: string): Record<GenrmAction, string> {
  const k = genrmTopicIndex(promptId);
  const topic = k === undefined ? undefined : GENRM_TOPICS[k];
  const [core, more, example] = topic
    ? FACTS[topic]
    : ['The answer depends on the details of the question.', 'More context would help.', 'a question with a missing detail'];
  const name = topic ?? 'this';
  return {
    answer_a: `${core} ${more} This holds because it follows from how ${name} works; for example, think of ${example}. Therefore it is worth understanding. In summary, that is ${name}.`,
    answer_b: `${core} ${more} This holds because it follows from how ${name} works, and therefore it is worth understanding.`,
    answer_c: `${capitalize(name)} is an interesting subject because it has several parts that can be complicated.`,
    answer_d: 'I am not sure.',
  };
}

/** Which answer a text is, for a judge that scores by the intended quality; undefined if none. */
export function genrmAnswerOf(promptId: string, text: string): GenrmAction | undefined {
  const answers = genrmAnswers(promptId);
  return GENRM_ACTIONS.find((a) => answers[a] === text.trim());
}

function capitalize(s: string): string {
  return s.charAt(0).toUpperCase() + s.slice(1);
}
