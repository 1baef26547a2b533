// Scrapes a server's `/metrics` over real HTTP and parses it with a strict parser of the
// Prometheus text format 0.0.4 written here: the npm parser looked at
// (parse-prometheus-text-format 1.1.1) drops the labels, `_count` and `_sum` of labelled
// histograms. Anything the format does not allow throws, naming the line.
import { type Dispatcher, request } from 'undici';

export type MetricType = 'counter' | 'gauge' | 'histogram' | 'summary' | 'untyped';

export interface Sample {
  /** The sample's own name (`x_bucket`, `x_sum`, `x_count` for a histogram `x`). */
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Family {
  name: string;
  help: string | undefined;
  type: MetricType;
  samples: Sample[];
}

export interface Scrape {
  status: number;
  contentType: string;
  text: string;
  families: Map<string, Family>;
}

export async function scrape(dispatcher: Dispatcher, baseUrl: string, headers: Record<string, string> = {}): Promise<Scrape> {
  const res = await request(`${baseUrl}/metrics`, { method: 'GET', headers, dispatcher });
  const text = await res.body.text();
  const contentType = String(res.headers['content-type'] ?? '');
  return { status: res.statusCode, contentType, text, families: res.statusCode === 200 ? parsePrometheusText(text) : new Map() };
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;
const TYPES = new Set<MetricType>(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

/** Go's ParseFloat, as Prometheus reads values: decimal, or Inf / NaN in any case. */
function parseFloatStrict(s: string, where: string): number {
  if (/^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/.test(s)) return Number(s);
  if (/^[+-]?inf(inity)?$/i.test(s)) return s.startsWith('-') ? -Infinity : Infinity;
  if (/^nan$/i.test(s)) return Number.NaN;
  throw new Error(`${where}: '${s}' is not a float`);
}

function sampleNamesOf(f: Family): string[] {
  if (f.type === 'histogram') return [`${f.name}_bucket`, `${f.name}_sum`, `${f.name}_count`];
  if (f.type === 'summary') return [f.name, `${f.name}_sum`, `${f.name}_count`];
  return [f.name];
}

export function parsePrometheusText(text: string): Map<string, Family> {
  if (text.length > 0 && !text.endsWith('\n')) throw new Error('the text does not end with a line feed');
  const families = new Map<string, Family>();
  const series = new Set<string>();
  const typed = new Set<string>();
  let current: Family | undefined;
  const lines = text.split('\n').slice(0, -1);

  // All lines of one family form one group: a family seen before may not start again.
  const open = (name: string, where: string): Family => {
    if (current?.name === name) return current;
    if (families.has(name)) throw new Error(`${where}: family ${name} is not contiguous`);
    current = { name, help: undefined, type: 'untyped', samples: [] };
    families.set(name, current);
    return current;
  };

  lines.forEach((line, i) => {
    const where = `line ${i + 1} '${line}'`;
    if (line === '') return;
    if (line.startsWith('#')) {
      const m = /^#[ \t]+(HELP|TYPE)[ \t]+(\S+)(?:[ \t]+(.*))?$/.exec(line);
      if (!m) return; // a plain comment
      const [, keyword, name, rest = ''] = m;
      if (METRIC_NAME.exec(name!)?.[0] !== name) throw new Error(`${where}: bad metric name`);
      const f = open(name!, where);
      if (keyword === 'HELP') {
        if (f.help !== undefined) throw new Error(`${where}: second HELP`);
        f.help = unescapeText(rest, false, where);
      } else {
        if (typed.has(name!)) throw new Error(`${where}: second TYPE`);
        if (f.samples.length > 0) throw new Error(`${where}: TYPE after samples`);
        if (!TYPES.has(rest as MetricType)) throw new Error(`${where}: unknown type`);
        f.type = rest as MetricType;
        typed.add(name!);
      }
      return;
    }
    const s = parseSample(line, where);
    const f = current && sampleNamesOf(current).includes(s.name) ? current : open(s.name, where);
    if (f.type === 'histogram' && s.name === `${f.name}_bucket`) {
      if (s.labels.le === undefined) throw new Error(`${where}: bucket without le`);
      parseFloatStrict(s.labels.le, where);
    }
    if (f.type === 'summary' && s.name === f.name && s.labels.quantile === undefined) throw new Error(`${where}: summary sample without quantile`);
    const key = `${s.name}${JSON.stringify(Object.entries(s.labels).sort())}`;
    if (series.has(key)) throw new Error(`${where}: duplicate series`);
    series.add(key);
    f.samples.push(s);
  });
  for (const f of families.values()) if (f.type === 'histogram') checkHistogram(f);
  return families;
}

function parseSample(line: string, where: string): Sample {
  const name = METRIC_NAME.exec(line)?.[0];
  if (!name) throw new Error(`${where}: bad metric name`);
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === '{') {
    i++;
    while (line[i] !== '}') {
      const label = LABEL_NAME.exec(line.slice(i))?.[0];
      if (!label || label.startsWith('__')) throw new Error(`${where}: bad label name at ${i}`);
      if (Object.hasOwn(labels, label)) throw new Error(`${where}: label ${label} twice`);
      i += label.length;
      if (line.slice(i, i + 2) !== '="') throw new Error(`${where}: expected =" at ${i}`);
      i += 2;
      let raw = '';
      for (; i < line.length && line[i] !== '"'; i++) {
        raw += line[i];
        if (line[i] === '\\') raw += line[++i] ?? '';
      }
      if (line[i] !== '"') throw new Error(`${where}: unterminated label value`);
      labels[label] = unescapeText(raw, true, where);
      i++;
      if (line[i] === ',') i++;
      else if (line[i] !== '}') throw new Error(`${where}: expected , or } at ${i}`);
    }
    i++;
  }
  const m = /^[ \t]+(\S+)(?:[ \t]+(-?\d+))?$/.exec(line.slice(i));
  if (!m) throw new Error(`${where}: expected a value and an optional timestamp`);
  return { name, labels, value: parseFloatStrict(m[1]!, where) };
}

/** HELP text allows `\\` and `\n`; label values also `\"`. */
function unescapeText(raw: string, labelValue: boolean, where: string): string {
  return raw.replace(/\\(.?)/g, (_, c: string) => {
    if (c === '\\') return '\\';
    if (c === 'n') return '\n';
    if (c === '"' && labelValue) return '"';
    throw new Error(`${where}: bad escape \\${c}`);
  });
}

/** Per series: a +Inf bucket, cumulative buckets, `_count` equal to the +Inf bucket, a `_sum`. */
function checkHistogram(f: Family): void {
  const groups = new Map<string, { buckets: Array<[number, number]>; count?: number; sum?: number }>();
  for (const s of f.samples) {
    const { le, ...rest } = s.labels;
    const key = JSON.stringify(Object.entries(rest).sort());
    let g = groups.get(key);
    if (!g) groups.set(key, (g = { buckets: [] }));
    if (s.name === `${f.name}_bucket`) g.buckets.push([parseFloatStrict(le!, f.name), s.value]);
    else if (le !== undefined) throw new Error(`${f.name}: le on ${s.name}`);
    else if (s.name === `${f.name}_count`) g.count = s.value;
    else g.sum = s.value;
  }
  for (const [key, g] of groups) {
    g.buckets.sort((a, b) => a[0] - b[0]);
    const inf = g.buckets.at(-1);
    if (inf?.[0] !== Infinity) throw new Error(`${f.name}${key}: no +Inf bucket`);
    for (let i = 1; i < g.buckets.length; i++) if (g.buckets[i]![1] < g.buckets[i - 1]![1]) throw new Error(`${f.name}${key}: buckets not cumulative`);
    if (g.count !== inf[1]) throw new Error(`${f.name}${key}: _count ${g.count} differs from the +Inf bucket ${inf[1]}`);
    if (g.sum === undefined) throw new Error(`${f.name}${key}: no _sum`);
  }
}

// --- reading a scrape -------------------------------------------------------------------------

/** The family, which must exist with this type. */
export function family(s: Scrape, name: string, type: MetricType): Family {
  const f = s.families.get(name);
  if (!f) throw new Error(`no metric ${name} in:\n${s.text}`);
  if (f.type !== type) throw new Error(`${name} is a ${f.type}, expected ${type}`);
  return f;
}

const sameLabels = (a: Record<string, string>, b: Record<string, string>): boolean =>
  JSON.stringify(Object.entries(a).sort()) === JSON.stringify(Object.entries(b).sort());

function one(f: Family, sampleName: string, labels: Record<string, string>): Sample {
  const hits = f.samples.filter((m) => m.name === sampleName && sameLabels(m.labels, labels));
  if (hits.length !== 1) throw new Error(`${sampleName}${JSON.stringify(labels)}: ${hits.length} samples`);
  return hits[0]!;
}

/** A counter's or gauge's value. */
export function value(s: Scrape, name: string, type: 'counter' | 'gauge', labels: Record<string, string> = {}): number {
  return one(family(s, name, type), name, labels).value;
}

/** A histogram series' `_count` and `_sum`. */
export function histogram(s: Scrape, name: string, labels: Record<string, string> = {}): { count: number; sum: number } {
  const f = family(s, name, 'histogram');
  return { count: one(f, `${name}_count`, labels).value, sum: one(f, `${name}_sum`, labels).value };
}

/** Every label value of every sample. */
export function labelValues(s: Scrape): string[] {
  return [...s.families.values()].flatMap((f) => f.samples.flatMap((m) => Object.values(m.labels)));
}
