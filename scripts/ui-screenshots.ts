// A run in the Temporal Web UI, in headless Chromium (scripts/chromium.ts): its workflows listed by
// the search attributes they set, its failed checkpoint attempts, the run's own page and a
// checkpoint attempt's page with its stage table. The demo saves these beside its report; an e2e
// test checks that each page shows what it should.
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import type { Client } from '@temporalio/client';
import type { Page } from 'playwright-core';
import { runQueries } from '../workflows/search-attributes.js';
import { launchChromium, openPage, screenshot } from './chromium.js';

export interface UiShot {
  name: string;
  url: string;
  file: string;
  /** Text the page showed once ready (what the shot proves). */
  showed: string;
}

/**
 * Takes the screenshots into `outDir` (`<name>.png`). A page is ready when it shows the text it is
 * about (a workflow ID); a page that never does fails the call naming its URL.
 */
export async function screenshotRunInUi(
  client: Client,
  opts: { uiUrl: string; run: string; outDir: string; namespace?: string; timeoutMs?: number },
): Promise<UiShot[]> {
  const ns = opts.namespace ?? 'default';
  const base = `${opts.uiUrl.replace(/\/$/, '')}/namespaces/${encodeURIComponent(ns)}`;
  const q = runQueries(opts.run);
  const list = (query: string): string => `${base}/workflows?query=${encodeURIComponent(query)}`;
  const page = async (workflowId: string): Promise<string> => {
    const { runId } = await client.workflow.getHandle(workflowId).describe();
    return `${base}/workflows/${encodeURIComponent(workflowId)}/${runId}/history`;
  };
  const failed: string[] = [];
  for await (const wf of client.workflow.list({ query: q.failedCheckpoints })) failed.push(wf.workflowId);
  let completed: string | undefined;
  for await (const wf of client.workflow.list({ query: `${q.all} AND CheckpointOutcome = 'completed'` })) completed ??= wf.workflowId;
  const checkpoint = failed[0] ?? completed;
  const shots: Array<Omit<UiShot, 'file'> & { tab?: string }> = [
    { name: 'ui-run-workflows', url: list(q.all), showed: opts.run },
    { name: 'ui-run', url: await page(opts.run), showed: opts.run },
    ...(failed.length ? [{ name: 'ui-failed-checkpoints', url: list(q.failedCheckpoints), showed: failed[0]! }] : []),
    ...(checkpoint ? [{ name: 'ui-checkpoint', url: await page(checkpoint), showed: checkpoint }] : []),
    // Its stage table: the workflow's current details (answered by a worker replaying it).
    ...(completed ? [{ name: 'ui-checkpoint-details', url: await page(completed), tab: 'User Metadata', showed: 'Gym commits' }] : []),
  ];
  const browser = await launchChromium({ viewport: { width: 1440, height: 1000 } });
  try {
    const out: UiShot[] = [];
    for (const shot of shots) {
      const { page: p } = await openPage(browser, shot.url);
      if (shot.tab)
        await p
          .getByText(shot.tab, { exact: true })
          .first()
          .click({ timeout: opts.timeoutMs ?? 30_000 });
      await showsText(p, shot.showed, opts.timeoutMs ?? 30_000).catch(async (err: Error) => {
        const seen = join(opts.outDir, `${shot.name}-not-ready.png`);
        await screenshot(p, seen).catch(() => undefined);
        throw new Error(`the Temporal UI at ${shot.url} never showed ${shot.showed} (what it showed: ${seen}): ${err.message.split('\n')[0]}`);
      });
      // The list's rows and the history's events arrive after the heading.
      await p.waitForLoadState('networkidle').catch(() => undefined);
      const file = join(opts.outDir, `${shot.name}.png`);
      await screenshot(p, file);
      await p.close();
      out.push({ name: shot.name, url: shot.url, showed: shot.showed, file });
    }
    return out;
  } finally {
    await browser.close();
  }
}

/**
 * Waits until the page or one of its frames shows `text`: the UI renders Markdown details in a
 * sandboxed frame. Locators, not evaluated expressions: the UI's content security policy forbids eval.
 */
async function showsText(page: Page, text: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    for (const frame of page.frames()) {
      if (
        (await frame
          .locator('body', { hasText: text })
          .count()
          .catch(() => 0)) > 0
      )
        return;
    }
    if (Date.now() > deadline) throw new Error(`no frame showed it within ${timeoutMs} ms`);
    await delay(250);
  }
}
