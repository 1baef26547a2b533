// The run report's page (scripts/report/html.ts): self-contained (no request leaves it, Chart.js
// inline), its data embedded so that no value can break out of its element, numbers rounded for
// display, and a sentence where a chart has nothing to show. The page in a real browser:
// test/e2e/controller.test.ts (the turn-level recovery run).
import { describe, expect, it } from 'vitest';
import type { ReportData } from '../../scripts/report/data.js';
import { CHART_IDS, chartJsSource, duration, escapeHtml, renderReportHtml } from '../../scripts/report/html.js';

const CHART_STUB = 'window.Chart = function () {};';

function data(over: Partial<ReportData> = {}): ReportData {
  return {
    run: 'demo-1',
    state: 'completed',
    failure: null,
    startedAt: '2026-01-01T00:00:00.000Z',
    closedAt: '2026-01-01T00:02:05.000Z',
    generatedAt: '2026-01-01T00:03:00.000Z',
    source: 'result',
    restoredFrom: null,
    config: { checkpointDir: '/ckpt', tasksets: ['counter', 'genrm'], maxSteps: 10, promptsPerStep: 4, generationsPerPrompt: 4, targetLevel: 'turn' },
    totals: {
      steps: 10,
      trainerVersion: 10,
      completedRollouts: 160,
      failedRollouts: 0,
      dispatched: 171,
      shards: 1,
      executions: 1,
      checkpoints: { completed: 1, failed: 1, skipped: 0 },
      recoveries: 1,
      continued: 7,
      restarted: 4,
    },
    rewardPerStep: [
      { step: 1, reward: 0.25 },
      { step: 2, reward: 0.5 },
    ],
    checkpoints: [
      {
        checkpointId: 'rollout-step-3-snapshot-7-0123456789abcdef0123456789abcdef',
        sequence: 7,
        trigger: 'periodic',
        outcome: 'completed',
        reason: 'completed',
        at: '2026-01-01T00:00:30.000Z',
        t: 30,
        admissionClosed: 0.333,
        total: 0.206,
        gymParticipant: 0.2,
        stages: { prepare: 0.1, commit: 0.05 },
        scopeCount: 8,
        restartCount: 0,
        error: null,
        source: 'metrics',
      },
      {
        checkpointId: 'manual-2',
        sequence: null,
        trigger: 'manual',
        outcome: 'failed',
        reason: 'io_error',
        at: '2026-01-01T00:00:50.000Z',
        t: 50,
        admissionClosed: 7.273,
        total: 7.2,
        gymParticipant: 7.18,
        stages: {},
        scopeCount: null,
        restartCount: null,
        error: 'prepare failed: <ECONNREFUSED>',
        source: 'run',
      },
    ],
    recoveries: [
      {
        startedAt: '2026-01-01T00:01:00.000Z',
        tStart: 60,
        at: '2026-01-01T00:01:10.000Z',
        t: 70,
        cold: false,
        restoreFailed: false,
        continued: 7,
        restarted: 4,
        shardsAnswered: 1,
        shardsAsked: 1,
        error: null,
      },
    ],
    timeline: {
      dispatched: [
        { t: 0, n: 0 },
        { t: 1, n: 16 },
      ],
      completed: [
        { t: 0, n: 0 },
        { t: 5, n: 16 },
      ],
      inFlight: [
        { t: 0, n: 0 },
        { t: 1, n: 16 },
        { t: 5, n: 0 },
      ],
    },
    metrics: { file: '/ckpt/checkpoint_metrics.jsonl', found: true, lines: 2, duplicates: 1, unreadable: 0, otherRuns: 0 },
    notes: ['1 repeated line(s) of checkpoint_metrics.jsonl dropped (a retried append)'],
    ...over,
  };
}

/** The JSON the page's script reads. */
function embedded(html: string): unknown {
  const m = /<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/.exec(html);
  return JSON.parse(m![1]!);
}

describe('renderReportHtml', () => {
  it('is one self-contained document: a CSP that allows no request, no src or href, Chart.js inline', () => {
    const html = renderReportHtml(data(), { chartJs: CHART_STUB });
    expect(html.startsWith('<!doctype html>')).toBe(true);
    expect(html).toContain(`content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"`);
    expect(html).not.toMatch(/\s(src|href)=/i);
    expect(html).not.toMatch(/@import|url\(/);
    expect(html).toContain(`<script>${CHART_STUB}</script>`);
    // Data, then Chart.js, then the page's own script.
    expect(html.match(/<script[\s>]/g)).toHaveLength(3);
  });

  it('embeds the data whole; no value can end its element or the page’s markup', () => {
    const evil = data({
      run: 'x</script><script>alert(1)</script>',
      failure: '<img src=x onerror=alert(1)> & "quotes"',
      state: 'failed',
      notes: ['</script><!-- a note'],
    });
    const html = renderReportHtml(evil, { chartJs: CHART_STUB });
    expect(embedded(html)).toEqual(evil);
    expect(html.match(/<script[\s>]/g)).toHaveLength(3);
    expect(html.match(/<\/script>/g)).toHaveLength(3);
    expect(html).not.toContain('<img');
    expect(html).toContain('&lt;img src=x onerror=alert(1)&gt; &amp; &quot;quotes&quot;');
    expect(html).toContain('<title>Run report: x&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>');
  });

  it('escapes a closing script tag inside the inlined library too', () => {
    const html = renderReportHtml(data(), { chartJs: 'var s = "</script><script>boom()";' });
    expect(html).toContain('var s = "<\\/script><script>boom()";');
    expect(html.match(/<\/script>/g)).toHaveLength(3);
  });

  it('shows every chart, the totals, and the tables with numbers rounded for display', () => {
    const html = renderReportHtml(data(), { chartJs: CHART_STUB });
    for (const id of CHART_IDS) expect(html).toContain(`<canvas id="${id}"`);
    expect(html).toContain('<span class="badge completed">completed</span>');
    expect(html).toContain('ended 2026-01-01 00:02:05 UTC (2 min 05 s)');
    expect(html).toContain('4 prompts × 4 generations a step over counter, genrm');
    expect(html).toMatch(/<div class="value">10 of 10<\/div><div class="sub">last mean reward 0\.500<\/div>/);
    expect(html).toContain('7 continued · 4 restarted');
    // The checkpoint table: an ID shortened (whole in its title), milliseconds, dashes for stages not reached.
    expect(html).toContain('<code title="rollout-step-3-snapshot-7-0123456789abcdef0123456789abcdef">rollout-step-3-snapshot-7…</code>');
    expect(html).toContain('<td>0.333</td><td>0.206</td><td>—</td><td>—</td><td>0.100</td><td>0.050</td>');
    expect(html).toContain('title="prepare failed: &lt;ECONNREFUSED&gt;">failed: io_error</span>');
    expect(html).toContain('title="missing from checkpoint_metrics.jsonl: from the run’s own record">run</span>');
    expect(html).toContain('<td>1</td><td>Gym crash</td><td>60.0</td><td>70.0</td><td>7</td><td>4</td><td>1 of 1</td><td>—</td>');
    expect(html).toContain('<li>1 repeated line(s) of checkpoint_metrics.jsonl dropped (a retried append)</li>');
    expect(html).toContain('/ckpt/checkpoint_metrics.jsonl (2 lines)');
  });

  it('a chart with nothing to show is a sentence, not an empty canvas', () => {
    const html = renderReportHtml(
      data({
        state: 'running',
        closedAt: null,
        rewardPerStep: [],
        checkpoints: [],
        recoveries: [],
        timeline: { dispatched: [{ t: 0, n: 0 }], completed: [{ t: 0, n: 0 }], inFlight: [{ t: 0, n: 0 }] },
        totals: { ...data().totals, dispatched: 0 },
      }),
      { chartJs: CHART_STUB },
    );
    expect(html).not.toContain('<canvas');
    expect(html).toContain('No training step yet.');
    expect(html).toContain('No recoveries: Gym never crashed under this run.');
    expect(html).toContain('No rollout attempt was dispatched.');
    expect(html).toContain('running for 3 min 00 s');
  });

  it('a run that took over a checkpoint directory says from which step', () => {
    const html = renderReportHtml(data({ restoredFrom: { anchor: 'step_2', step: 2, snapshotDir: null } }), { chartJs: CHART_STUB });
    expect(html).toContain('· took over step_2 at step 2</p>');
  });
});

describe('helpers', () => {
  it('duration and escaping', () => {
    expect([duration(4.25), duration(125), duration(7_500), duration(Number.NaN)]).toEqual(['4.3 s', '2 min 05 s', '2 h 05 min', '—']);
    expect(escapeHtml(`<a href="x">'&'</a>`)).toBe('&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;');
  });

  it('chartJsSource is the installed Chart.js 4.6.1 UMD build, without its source map comment', () => {
    const src = chartJsSource();
    expect(src).toMatch(/^\/\*!\n \* Chart\.js v4\.6\.1/);
    expect(src).not.toContain('sourceMappingURL');
    expect(src.length).toBeGreaterThan(100_000);
  });
});
