// The run report's page: ReportData → one self-contained HTML file (styles, data, Chart.js and
// the script drawing the charts all inline; its Content-Security-Policy allows no request, so it
// opens anywhere, offline, from a file). Pure but for chartJsSource(), which reads Chart.js.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { type CheckpointRow, type RecoveryRow, type ReportData, STAGES } from './data.js';

/** Chart.js's UMD build (installed with the project), ready to inline. */
export function chartJsSource(): string {
  // The package exports only its module builds; the UMD file sits beside the CommonJS one.
  const dist = dirname(createRequire(import.meta.url).resolve('chart.js'));
  // Its source map is not inlined: a browser's devtools would ask for the missing file.
  return readFileSync(join(dist, 'chart.umd.js'), 'utf8').replace(/\n\/\/# sourceMappingURL=\S+\s*$/, '\n');
}

/** The charts a page has, by canvas ID (a chart without data is a sentence instead). */
export const CHART_IDS = ['chart-reward', 'chart-admission', 'chart-stages', 'chart-recoveries', 'chart-timeline'] as const;

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** Text for inside a <script> element: nothing in it can close the element or open a comment. */
function scriptText(s: string): string {
  return s.replace(/<\/(script)/gi, '<\\/$1').replace(/<!--/g, '<\\!--');
}

/** JSON for a <script type="application/json">: `<` escaped, so no value can end the element. */
function jsonText(v: unknown): string {
  return JSON.stringify(v)
    .replace(/</g, '\\u003c')
    .replace(/\u2028/g, '\\u2028')
    .replace(/\u2029/g, '\\u2029');
}

const dash = '—';
const plural = (n: number, what: string): string => `${n} ${what}${n === 1 ? '' : 's'}`;
const num = (x: number | null | undefined, digits = 3): string => (x === null || x === undefined ? dash : x.toFixed(digits));

/** A duration for people: 42.1 s, 3 min 05 s, 2 h 04 min. */
export function duration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return dash;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** An ISO time as `2026-12-02 16:27:03 UTC`. */
function when(isoTime: string | null): string {
  return isoTime ? `${isoTime.slice(0, 10)} ${isoTime.slice(11, 19)} UTC` : dash;
}

function card(label: string, value: string, sub = ''): string {
  return `<div class="card"><div class="label">${escapeHtml(label)}</div><div class="value">${escapeHtml(value)}</div>${sub ? `<div class="sub">${escapeHtml(sub)}</div>` : ''}</div>`;
}

function chart(id: string, title: string, caption: string, empty: string | null, wide = false): string {
  const body =
    empty === null
      ? `<div class="box"><canvas id="${id}" role="img" aria-label="${escapeHtml(title)}"></canvas></div>`
      : `<p class="empty">${escapeHtml(empty)}</p>`;
  return `<figure class="chart${wide ? ' wide' : ''}"><h2>${escapeHtml(title)}</h2>${body}<figcaption>${escapeHtml(caption)}</figcaption></figure>`;
}

function checkpointTable(rows: CheckpointRow[]): string {
  if (rows.length === 0) return '<p class="empty">No checkpoint attempts.</p>';
  const head = ['#', 'checkpoint', 'trigger', 'outcome', 'at', 'admission closed', 'total', ...STAGES, 'scope', 'restarts'];
  const body = rows.map((r, i) => {
    const outcome = r.outcome === r.reason ? r.outcome : `${r.outcome}: ${r.reason}`;
    const cells = [
      String(i + 1),
      `<code title="${escapeHtml(r.checkpointId)}">${escapeHtml(shortId(r.checkpointId))}</code>${r.source === 'run' ? ' <span class="tag" title="missing from checkpoint_metrics.jsonl: from the run’s own record">run</span>' : ''}`,
      escapeHtml(r.trigger),
      `<span class="outcome ${escapeHtml(r.outcome)}"${r.error ? ` title="${escapeHtml(r.error)}"` : ''}>${escapeHtml(outcome)}</span>`,
      num(r.t, 1),
      num(r.admissionClosed),
      num(r.total),
      ...STAGES.map((s) => num(r.stages[s])),
      r.scopeCount === null ? dash : String(r.scopeCount),
      r.restartCount === null ? dash : String(r.restartCount),
    ];
    return `<tr>${cells.map((c) => `<td>${c}</td>`).join('')}</tr>`;
  });
  return `<div class="scroll"><table><thead><tr>${head.map((h) => `<th>${escapeHtml(h)}</th>`).join('')}</tr></thead><tbody>${body.join('')}</tbody></table></div><p class="note">Seconds; at: since the run started; scope and restarts: episodes saved and episodes Gym restarted.</p>`;
}

/** `rollout-step-3-snapshot-7-<32 hex>` → `rollout-step-3-snapshot-7…` (the whole ID is its tooltip). */
function shortId(id: string): string {
  return id.replace(/-[0-9a-f]{32}$/, '…');
}

function recoveryKind(r: RecoveryRow): string {
  return `${r.cold ? 'cold start' : 'Gym crash'}${r.restoreFailed ? ' (restore failed)' : ''}`;
}

function recoveryTable(rows: RecoveryRow[]): string {
  if (rows.length === 0) return '<p class="empty">No recoveries: Gym never crashed under this run.</p>';
  const head = ['#', 'kind', 'began', 'settled', 'continued', 'restarted', 'shards answered', 'error'];
  const body = rows.map((r, i) => {
    const cells = [
      String(i + 1),
      escapeHtml(recoveryKind(r)),
      num(r.tStart, 1),
      num(r.t, 1),
      String(r.continued),
      String(r.restarted),
      `${r.shardsAnswered} of ${r.shardsAsked}`,
      r.error ? escapeHtml(r.error) : dash,
    ];
    return `<tr>${cells.map((c) => `<td>${c}</td>`).join('')}</tr>`;
  });
  return `<div class="scroll"><table><thead><tr>${head.map((h) => `<th>${escapeHtml(h)}</th>`).join('')}</tr></thead><tbody>${body.join('')}</tbody></table></div><p class="note">Began and settled: seconds since the run started; continued from the saved turn, or restarted from input.</p>`;
}

const STYLE = `
:root { color-scheme: light; --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg: #f6f7f9; --card: #fff; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
main { max-width: 1280px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 8px 4px 0; display: inline-block; }
h2 { font-size: 15px; margin: 0 0 8px; }
.meta { color: var(--muted); margin: 4px 0 16px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 999px; font-size: 12px; font-weight: 600; vertical-align: 3px; background: #e6e8ee; }
.badge.completed { background: #dcefe0; color: #1f5f2c; } .badge.running { background: #e3ecfa; color: #1e4f99; }
.badge.failed, .badge.terminated, .badge.canceled, .badge.timed_out { background: #f8dedb; color: #8c2318; }
.failure { background: #fdf1ef; border: 1px solid #f1c7c1; padding: 8px 12px; border-radius: 6px; margin: 0 0 16px; white-space: pre-wrap; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px; margin-bottom: 20px; }
.card, .chart, section.table { background: var(--card); border: 1px solid var(--line); border-radius: 8px; }
.card { padding: 10px 14px; } .card .label { color: var(--muted); font-size: 12px; } .card .value { font-size: 20px; font-weight: 600; } .card .sub { color: var(--muted); font-size: 12px; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 16px; margin-bottom: 20px; }
.chart { margin: 0; padding: 14px 16px; } .chart.wide { grid-column: 1 / -1; }
.box { position: relative; height: 260px; } .wide .box { height: 300px; }
figcaption, .note { color: var(--muted); font-size: 12px; margin: 6px 0 0; }
.empty { color: var(--muted); font-style: italic; margin: 8px 0; }
section.table { padding: 14px 16px; margin-bottom: 16px; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; font-variant-numeric: tabular-nums; }
th, td { text-align: right; padding: 4px 7px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th:nth-child(-n+4), td:nth-child(-n+4) { text-align: left; }
th { color: var(--muted); font-weight: 600; white-space: normal; vertical-align: bottom; }
.outcome.completed { color: #1f5f2c; } .outcome.failed { color: #8c2318; } .outcome.skipped { color: var(--muted); }
.tag { font-size: 10px; background: #eef0f4; border-radius: 4px; padding: 0 4px; color: var(--muted); }
footer { color: var(--muted); font-size: 12px; margin-top: 8px; }
@media (max-width: 800px) { .grid { grid-template-columns: 1fr; } }
`;

/** Draws the charts from the JSON element; sets `document.body.dataset.charts` to how many it drew. */
const PAGE_SCRIPT = `
(function () {
  'use strict';
  var d = JSON.parse(document.getElementById('report-data').textContent);
  var OUTCOME = { completed: '#3a8d4f', failed: '#c8483b', skipped: '#a3a9b5' };
  var STAGE = { allocate: '#9a9a9a', candidates: '#8e6cc4', prepare: '#3e7cc9', commit: '#2aa198', ledger_cut: '#7fb13b', publish: '#e0a030', resume: '#d9694a' };
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.font.family = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  Chart.defaults.color = '#5b6475';
  var drawn = 0;
  function draw(id, config) {
    var el = document.getElementById(id);
    if (!el) return;
    new Chart(el, config);
    drawn++;
  }
  // Legends in the datasets' own order (a dataset's \`order\` only says what is drawn on top).
  Chart.defaults.plugins.legend.labels.sort = function (a, b) { return a.datasetIndex - b.datasetIndex; };
  function seconds(title) { return { beginAtZero: true, title: { display: true, text: title } }; }
  var cps = d.checkpoints;
  var cpLabels = cps.map(function (c, i) { return (i + 1) + ' · ' + c.trigger; });
  var cpTitle = function (items) { return cps[items[0].dataIndex].checkpointId; };

  draw('chart-reward', {
    type: 'line',
    data: { datasets: [{ label: 'mean reward', data: d.rewardPerStep.map(function (r) { return { x: r.step, y: r.reward }; }),
      borderColor: '#3e7cc9', backgroundColor: '#3e7cc9', pointRadius: 3, tension: 0 }] },
    options: { plugins: { legend: { display: false } },
      scales: { x: { type: 'linear', title: { display: true, text: 'training step' }, ticks: { precision: 0 } },
        y: { suggestedMin: 0, suggestedMax: 1, title: { display: true, text: 'mean reward' } } } }
  });

  draw('chart-admission', {
    type: 'bar',
    data: { labels: cpLabels, datasets: [
      // A higher order is drawn first: the bars under the totals' marks.
      { type: 'bar', label: 'admission closed (s)', order: 1, data: cps.map(function (c) { return c.admissionClosed; }),
        backgroundColor: cps.map(function (c) { return OUTCOME[c.outcome] || '#a3a9b5'; }) },
      { type: 'line', label: 'attempt total (s)', data: cps.map(function (c) { return c.total; }), borderColor: '#1d2330', backgroundColor: '#1d2330',
        showLine: false, pointStyle: 'crossRot', pointRadius: 6 }
    ] },
    options: { plugins: { tooltip: { callbacks: { title: cpTitle } } }, scales: { y: seconds('seconds') } }
  });

  draw('chart-stages', {
    type: 'bar',
    data: { labels: cpLabels, datasets: Object.keys(STAGE).map(function (s) {
      return { label: s, data: cps.map(function (c) { return c.stages[s] === undefined ? null : c.stages[s]; }), backgroundColor: STAGE[s] };
    }) },
    options: { plugins: { tooltip: { callbacks: { title: cpTitle } } }, scales: { y: seconds('seconds') } }
  });

  var recs = d.recoveries;
  draw('chart-recoveries', {
    type: 'bar',
    data: { labels: recs.map(function (r, i) { return (i + 1) + ' · ' + (r.cold ? 'cold start' : 'Gym crash') + (r.restoreFailed ? ' (restore failed)' : ''); }),
      datasets: [
        { label: 'continued from the saved turn', data: recs.map(function (r) { return r.continued; }), backgroundColor: '#3a8d4f' },
        { label: 'restarted from input', data: recs.map(function (r) { return r.restarted; }), backgroundColor: '#e0a030' }
      ] },
    options: { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: 'rollouts' } } } }
  });

  var xy = function (ps) { return ps.map(function (p) { return { x: p.t, y: p.n }; }); };
  var tl = d.timeline;
  draw('chart-timeline', {
    type: 'line',
    data: { datasets: [
      { label: 'dispatched', data: xy(tl.dispatched), borderColor: '#3e7cc9', backgroundColor: '#3e7cc9', stepped: true, pointRadius: 0, borderWidth: 2 },
      { label: 'completed', data: xy(tl.completed), borderColor: '#3a8d4f', backgroundColor: '#3a8d4f', stepped: true, pointRadius: 0, borderWidth: 2 },
      { label: 'in flight', data: xy(tl.inFlight), borderColor: '#a3a9b5', backgroundColor: 'rgba(163,169,181,0.25)', stepped: true, pointRadius: 0, borderWidth: 1, fill: true },
      { type: 'scatter', label: 'checkpoint', order: -1, data: cps.filter(function (c) { return c.t !== null; }).map(function (c) { return { x: c.t, y: 0 }; }),
        borderColor: '#8e6cc4', backgroundColor: '#8e6cc4', pointStyle: 'rectRot', pointRadius: 5 },
      { type: 'scatter', label: 'recovery settled', order: -1, data: recs.filter(function (r) { return r.t !== null; }).map(function (r) { return { x: r.t, y: 0 }; }),
        borderColor: '#c8483b', backgroundColor: '#c8483b', pointStyle: 'triangle', pointRadius: 8 }
    ] },
    options: { interaction: { mode: 'nearest', intersect: false },
      scales: { x: { type: 'linear', beginAtZero: true, title: { display: true, text: 'seconds since the run started' } },
        y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: 'rollout attempts' } } } }
  });

  document.body.dataset.charts = String(drawn);
})();
`;

export interface RenderOptions {
  /** Chart.js's UMD source (chartJsSource()); tests may pass a stand-in. */
  chartJs: string;
}

export function renderReportHtml(d: ReportData, opts: RenderOptions): string {
  const t = d.totals;
  const span = d.startedAt ? (Date.parse(d.closedAt ?? d.generatedAt) - Date.parse(d.startedAt)) / 1000 : Number.NaN;
  const plannedSteps = d.config.maxSteps === null ? '' : ` of ${d.config.maxSteps}`;
  const shape =
    d.config.promptsPerStep === null
      ? ''
      : `${plural(d.config.promptsPerStep, 'prompt')} × ${plural(d.config.generationsPerPrompt ?? 0, 'generation')} a step over ${d.config.tasksets.join(', ')}`;
  const meta = [
    `started ${when(d.startedAt)}`,
    d.closedAt ? `ended ${when(d.closedAt)} (${duration(span)})` : `running for ${duration(span)}`,
    shape,
    d.config.targetLevel ? `recovery target level ${d.config.targetLevel}` : '',
    d.restoredFrom ? `took over ${d.restoredFrom.anchor ?? 'a checkpoint directory'} at step ${d.restoredFrom.step}` : '',
  ].filter(Boolean);
  const lastReward = d.rewardPerStep.length ? d.rewardPerStep[d.rewardPerStep.length - 1]!.reward.toFixed(3) : dash;
  const cards = [
    card('steps', `${t.steps}${plannedSteps}`, `last mean reward ${lastReward}`),
    card('rollouts completed', String(t.completedRollouts), `${t.failedRollouts} failed · ${t.dispatched} attempts dispatched`),
    card('checkpoints', String(t.checkpoints.completed), `completed · ${t.checkpoints.failed} failed · ${t.checkpoints.skipped} skipped`),
    card('recoveries', String(t.recoveries), `${t.continued} continued · ${t.restarted} restarted`),
    card('policy version', t.trainerVersion === null ? dash : String(t.trainerVersion), `${plural(t.shards, 'shard')} · ${plural(t.executions, 'execution')}`),
  ];
  const hasCheckpoints = d.checkpoints.length > 0;
  const charts = [
    chart(
      'chart-reward',
      'Mean reward per step',
      'The mean reward of each training step’s unmasked rollouts.',
      d.rewardPerStep.length ? null : 'No training step yet.',
    ),
    chart(
      'chart-admission',
      'Admission closed per checkpoint',
      'Seconds no rollout could be dispatched while the checkpoint ran (bar, by outcome: green completed, red failed, grey skipped); × the attempt’s own total.',
      hasCheckpoints ? null : 'No checkpoint attempts.',
    ),
    chart(
      'chart-stages',
      'Stage seconds per checkpoint',
      'Each stage of the attempt. Stages overlap (the shards cut their ledger while Gym commits), so they stand side by side, not stacked.',
      hasCheckpoints ? null : 'No checkpoint attempts.',
    ),
    chart(
      'chart-recoveries',
      'Rollouts continued vs restarted per recovery',
      'Unfinished rollouts of each recovery: continued from their saved turn as the next attempt, or started over from their input.',
      d.recoveries.length ? null : 'No recoveries: Gym never crashed under this run.',
    ),
    chart(
      'chart-timeline',
      'Dispatch and completion over time',
      'Rollout attempts the shards started and results they received (cumulative), and attempts in flight; ◆ checkpoints, ▲ recoveries settled.',
      t.dispatched ? null : 'No rollout attempt was dispatched.',
      true,
    ),
  ];
  const metricsNote = d.metrics.file
    ? d.metrics.found
      ? `${escapeHtml(d.metrics.file)} (${plural(d.metrics.lines, 'line')})`
      : `${escapeHtml(d.metrics.file)} (missing)`
    : 'no checkpoint_metrics.jsonl';
  const title = `Run report: ${d.run}`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>${escapeHtml(title)}</title>
<style>${STYLE}</style>
</head>
<body>
<main>
<header>
<h1>${escapeHtml(title)}</h1><span class="badge ${escapeHtml(d.state)}">${escapeHtml(d.state.replace('_', ' '))}</span>
<p class="meta">${meta.map(escapeHtml).join(' · ')}</p>
${d.failure ? `<p class="failure">${escapeHtml(d.failure)}</p>` : ''}
</header>
<section class="cards">${cards.join('')}</section>
<section class="grid">${charts.join('')}</section>
<section class="table"><h2>Checkpoint attempts</h2>${checkpointTable(d.checkpoints)}</section>
<section class="table"><h2>Recoveries</h2>${recoveryTable(d.recoveries)}</section>
${d.notes.length ? `<section class="table"><h2>Notes</h2><ul>${d.notes.map((n) => `<li>${escapeHtml(n)}</li>`).join('')}</ul></section>` : ''}
<footer>Generated ${escapeHtml(when(d.generatedAt))} by <code>npm run report</code> from the Temporal history of <code>${escapeHtml(d.run)}</code> (steps and rewards from its ${escapeHtml(d.source)}), its rollout shards’ histories, and ${metricsNote}. Times are seconds since the run started.</footer>
</main>
<script type="application/json" id="report-data">${jsonText(d)}</script>
<script>${scriptText(opts.chartJs)}</script>
<script>${scriptText(PAGE_SCRIPT)}</script>
</body>
</html>
`;
}
