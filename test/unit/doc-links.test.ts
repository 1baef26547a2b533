// Every relative link in README.md and docs/*.md resolves to a path inside the repository: markdown
// links (`[text](target)`, `[id]: target`), code spans written as relative paths (`./x`, `../x`),
// and code spans naming a path under one of the repository's top-level directories. Anchors and
// queries are stripped; http(s) and mailto are not checked.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DOCS = ['README.md', ...readdirSync(join(ROOT, 'docs')).flatMap((f) => (f.endsWith('.md') ? [`docs/${f}`] : []))];
// Checked-in top-level directories (dot directories and node_modules are generated or tooling).
const TOP_DIRS = new Set(
  readdirSync(ROOT, { withFileTypes: true }).flatMap((d) => (d.isDirectory() && !d.name.startsWith('.') && d.name !== 'node_modules' ? [d.name] : [])),
);

interface Link {
  line: number;
  target: string;
  /** Resolved against the document's directory, or the repository root. */
  base: 'doc' | 'root';
}

/** The links of a markdown text; fenced code blocks are not markdown. */
function linksOf(markdown: string): Link[] {
  const out: Link[] = [];
  let fenced = false;
  markdown.split('\n').forEach((text, i) => {
    if (/^\s*(```|~~~)/.test(text)) fenced = !fenced;
    if (fenced || /^\s*(```|~~~)/.test(text)) return;
    const line = i + 1;
    const spans = [...text.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    const prose = text.replace(/`[^`]*`/g, '');
    for (const m of prose.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+["'(][^)]*)?\)/g)) out.push({ line, target: m[1]!, base: 'doc' });
    const def = /^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?/.exec(prose);
    if (def) out.push({ line, target: def[1]!, base: 'doc' });
    for (const span of spans) {
      if (/^\.\.?\//.test(span) && !/\s/.test(span)) out.push({ line, target: span, base: 'doc' });
      else if (/^[\w.-]+\/[\w./-]*$/.test(span) && TOP_DIRS.has(span.split('/')[0]!)) out.push({ line, target: span, base: 'root' });
    }
  });
  return out;
}

/** Why a link of `doc` does not resolve to a path inside the repository, or undefined. */
function problem(doc: string, link: Link): string | undefined {
  if (/^(https?:|mailto:)/i.test(link.target) || link.target.startsWith('#')) return undefined;
  if (/^[a-z][a-z0-9+.-]*:/i.test(link.target)) return 'not a relative link';
  const path = decodeURIComponent(link.target.replace(/[#?].*$/, ''));
  const abs = resolve(link.base === 'doc' ? dirname(join(ROOT, doc)) : ROOT, path);
  const rel = relative(ROOT, abs);
  if (rel.startsWith('..') || isAbsolute(rel)) return 'outside the repository';
  return existsSync(abs) ? undefined : 'no such file';
}

describe('links in README.md and docs/*.md', () => {
  it('the checker finds broken links of every form', () => {
    const sample = [
      'See [the spec](../shared/spec.md#part), [ok](docs/controller.md) and ![img](./nope.png "title").',
      '[ref]: ../../elsewhere.md',
      'Spec: `../shared/protocol/controller.md`, code `scripts/nope.ts`, fine `scripts/run.ts`, not a path `a / b`.',
      '```',
      '[in a fence](../ignored.md) `../ignored.md`',
      '```',
      '[web](https://example.com/x) [mail](mailto:a@b.c) [anchor](#section)',
    ].join('\n');
    const found = linksOf(sample).map((l) => [l.target, problem('README.md', l) ?? 'ok']);
    expect(found).toEqual([
      ['../shared/spec.md#part', 'outside the repository'],
      ['docs/controller.md', 'ok'],
      ['./nope.png', 'no such file'],
      ['../../elsewhere.md', 'outside the repository'],
      ['../shared/protocol/controller.md', 'outside the repository'],
      ['scripts/nope.ts', 'no such file'],
      ['scripts/run.ts', 'ok'],
      ['https://example.com/x', 'ok'],
      ['mailto:a@b.c', 'ok'],
      ['#section', 'ok'],
    ]);
  });

  it.each(DOCS)('%s: every relative link resolves inside the repository', (doc) => {
    const text = readFileSync(join(ROOT, doc), 'utf8');
    const broken = linksOf(text).flatMap((l) => {
      const why = problem(doc, l);
      return why ? [`${doc}:${l.line}: ${l.target} (${why})`] : [];
    });
    expect(broken).toEqual([]);
  });
});
