// A real browser for the tests and scripts that look at a page: Debian's Chromium (installed by
// scripts/bootstrap.mjs) driven by playwright-core. Headless, with a fresh profile, and with every
// feature that would reach the network off: this machine's network is closed, and a page under
// test must not need it. Playwright starts Chromium in its own process group and kills the group
// when the context closes.
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { type BrowserContext, chromium, type Page } from 'playwright-core';

export const CHROMIUM_PATH = '/usr/bin/chromium';

export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

export interface Chromium {
  context: BrowserContext;
  close(): Promise<void>;
}

/** Chromium with a fresh --user-data-dir (removed on close). */
export async function launchChromium(opts: { viewport?: { width: number; height: number } } = {}): Promise<Chromium> {
  if (!existsSync(CHROMIUM_PATH)) {
    throw new Error(`${CHROMIUM_PATH} is missing: run \`npm run bootstrap\` as root (it installs Debian's chromium with apt-get)`);
  }
  const profile = mkdtempSync(join(tmpdir(), 'chromium-profile-'));
  // A persistent context is how Playwright takes a profile directory of ours (its --user-data-dir).
  const context = await chromium
    .launchPersistentContext(profile, {
      executablePath: CHROMIUM_PATH,
      headless: true,
      args: CHROMIUM_ARGS,
      viewport: opts.viewport ?? { width: 1280, height: 900 },
      timeout: 60_000,
    })
    .catch((err: unknown) => {
      rmSync(profile, { recursive: true, force: true });
      throw err;
    });
  return {
    context,
    async close() {
      await context.close().catch(() => undefined);
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

export interface OpenedPage {
  page: Page;
  /** Console messages of type error, and uncaught page errors, as they came. */
  errors: string[];
  /** Every URL the page asked for. */
  requests: string[];
}

/**
 * Opens `url` in a new page, collecting console errors, page errors and requests from the start.
 * With `offline`, every request but `url` itself is refused (and still listed), so a page that
 * needs the network shows it.
 */
export async function openPage(c: Chromium, url: string, opts: { offline?: boolean } = {}): Promise<OpenedPage> {
  const page = await c.context.newPage();
  const errors: string[] = [];
  const requests: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (err) => errors.push(`page error: ${err.message}`));
  page.on('request', (r) => requests.push(r.url()));
  if (opts.offline) await page.route('**/*', (route) => (route.request().url() === url ? route.continue() : route.abort()));
  await page.goto(url, { waitUntil: 'load' });
  return { page, errors, requests };
}

/** What the canvas check touches of the page's DOM (this project's tsconfig has no DOM types). */
interface CanvasLike {
  id: string;
  width: number;
  height: number;
  getContext(kind: '2d'): { getImageData(x: number, y: number, w: number, h: number): { data: ArrayLike<number> } } | null;
}

/** Per canvas of the page (by id): whether anything is painted on it (a pixel not fully transparent). */
export function paintedCanvases(page: Page): Promise<Record<string, boolean>> {
  return page.evaluate(() => {
    const doc = (globalThis as unknown as { document: { querySelectorAll(selector: string): ArrayLike<CanvasLike> } }).document;
    const out: Record<string, boolean> = {};
    for (const c of Array.from(doc.querySelectorAll('canvas'))) {
      const ctx = c.getContext('2d');
      let painted = false;
      if (ctx && c.width > 0 && c.height > 0) {
        const px = ctx.getImageData(0, 0, c.width, c.height).data;
        for (let i = 3; i < px.length && !painted; i += 4) painted = px[i]! > 0;
      }
      out[c.id || `canvas-${Object.keys(out).length}`] = painted;
    }
    return out;
  });
}

/** A full-page screenshot to `file` (its directory made). */
export async function screenshot(page: Page, file: string): Promise<void> {
  mkdirSync(dirname(file), { recursive: true });
  await page.screenshot({ path: file, fullPage: true });
}

export interface PageCheck {
  errors: string[];
  requests: string[];
  /** paintedCanvases() once the page was ready. */
  canvases: Record<string, boolean>;
}

/**
 * Opens a local page in a fresh Chromium with the network refused, waits for `ready` (a JS
 * expression, e.g. that its script has drawn everything), and says what it logged as errors,
 * what it requested and which canvases are painted; with `screenshotTo`, saves a full-page PNG.
 */
export async function checkPage(url: string, opts: { ready: string; screenshotTo?: string }): Promise<PageCheck> {
  const browser = await launchChromium();
  try {
    const { page, errors, requests } = await openPage(browser, url, { offline: true });
    await page.waitForFunction(opts.ready, undefined, { timeout: 20_000 }).catch((err: Error) => {
      throw new Error(`${url} never became ready (${opts.ready}); errors: ${JSON.stringify(errors)}: ${err.message}`);
    });
    const canvases = await paintedCanvases(page);
    if (opts.screenshotTo) await screenshot(page, opts.screenshotTo);
    return { errors, requests, canvases };
  } finally {
    await browser.close();
  }
}
