// The browser half of the dashboard benchmarks, driven by
// `cargo bench -p server --bench dashboard` (server/benches/dashboard.rs),
// which starts a node, seeds its coordination store and then runs this
// script against it. It prints one JSON object per line on stdout and reads
// commands, one per line, on stdin:
//
//   → {"render": {...}}           first-render timings of Nodes, Seats and
//                                  a seat's page (BENCH_STORY_SEAT's)
//   → {"ready": true}             the latency pages are open and watching
//   ← seen? <i>                   the node emitted event <i> (reason bench-<i>!)
//   → {"seen": i, "events": t, "seats": t}
//                                  when each page's DOM first showed event i
//                                  (ms since the Unix epoch, sub-ms precision)
//   ← done                        close everything and exit
//
// Environment: BENCH_URL, BENCH_NAME, BENCH_PASSWORD, BENCH_SEAT (the seat
// whose pauses are the events), BENCH_NODE (a node that must be in the Nodes
// table), BENCH_SEAT_ON_PAGE (a seat that must be on the Seats page's first
// page), BENCH_LOADS (page loads per page, default 5).

import { createInterface } from 'node:readline';
import { launchBrowser, signIn } from '../lib/harness.mjs';

const url = process.env.BENCH_URL;
const name = process.env.BENCH_NAME;
const password = process.env.BENCH_PASSWORD;
const seat = process.env.BENCH_SEAT;
const loads = Number(process.env.BENCH_LOADS || 5);

const say = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);

// Installed before any page script runs: note when the rows a page exists
// for are in the DOM, and when it has hydrated (ms since navigation start).
function watchFirstRender(selector) {
  const marks = { rows: null, hydrated: null };
  window.__marks = marks;
  const check = () => {
    if (marks.rows === null && document.querySelector(selector)) marks.rows = performance.now();
    if (marks.hydrated === null && document.documentElement.hasAttribute('data-hydrated')) {
      marks.hydrated = performance.now();
    }
  };
  new MutationObserver(check).observe(document, { subtree: true, childList: true, attributes: true });
  document.addEventListener('DOMContentLoaded', check);
}

async function firstRender(browser, storageState, path, selector) {
  const runs = [];
  for (let i = 0; i < loads; i++) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, storageState });
    const page = await context.newPage();
    await page.addInitScript(watchFirstRender, selector);
    await page.goto(`${url}${path}`);
    await page.waitForSelector(selector);
    await page.waitForSelector('html[data-hydrated]');
    const m = await page.evaluate(() => {
      const nav = performance.getEntriesByType('navigation')[0];
      return {
        html: nav.responseEnd,
        bytes: nav.transferSize || nav.encodedBodySize,
        rows: window.__marks.rows,
        hydrated: window.__marks.hydrated,
      };
    });
    runs.push(m);
    await context.close();
  }
  return runs;
}

// In a latency page: note when the DOM first contains each `bench-<i>`.
function watchEvents(rowSelector) {
  window.__seen = {};
  const scan = () => {
    const t = performance.timeOrigin + performance.now();
    // New events are on top: the first rows are enough.
    for (const row of [...document.querySelectorAll(rowSelector)].slice(0, 5)) {
      for (const m of row.textContent.matchAll(/bench-(\d+)!/g)) {
        if (!(m[1] in window.__seen)) window.__seen[m[1]] = t;
      }
    }
  };
  new MutationObserver(scan).observe(document.body, { subtree: true, childList: true, characterData: true });
}

const browser = await launchBrowser();
const login = await browser.newContext();
const first = await login.newPage();
await signIn(first, url, name, password);
const storageState = await login.storageState();
await login.close();

const render = {
  nodes: await firstRender(browser, storageState, '/settings/nodes', `tr[data-node="${process.env.BENCH_NODE}"]`),
  seats: await firstRender(browser, storageState, '/seats', `tr[data-seat="${process.env.BENCH_SEAT_ON_PAGE}"]`),
  seat_page: await firstRender(browser, storageState, `/seats/${process.env.BENCH_STORY_SEAT}`, 'ol.timeline-items li'),
};
say({ render });

// The latency pages: the Events page (each event is a row as it arrives)
// and the Seats page (the row of the paused seat, read again on the event).
// Each in a window of its own, both in the foreground.
const events = await (await browser.newContext({ viewport: { width: 1280, height: 800 }, storageState })).newPage();
await events.goto(`${url}/events`);
await events.waitForSelector('html[data-hydrated]');
await events.locator('.live.live-open').waitFor();
await events.evaluate(watchEvents, 'tr[data-event="seat_paused"]');
const seats = await (await browser.newContext({ viewport: { width: 1280, height: 800 }, storageState })).newPage();
await seats.goto(`${url}/seats?q=${encodeURIComponent(seat)}`);
await seats.waitForSelector('html[data-hydrated]');
await seats.locator('.live.live-open').waitFor();
await seats.evaluate(watchEvents, `tr[data-seat="${seat}"]`);
say({ ready: true });

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === 'done') break;
  if (cmd === 'seen?') {
    const i = arg;
    const get = async (p) => {
      const deadline = Date.now() + 30000;
      while (Date.now() < deadline) {
        const t = await p.evaluate((i) => window.__seen[i], i);
        if (t) return t;
        await new Promise((r) => setTimeout(r, 10));
      }
      const shown = await p.evaluate(() => [document.location.href, document.visibilityState, document.querySelector('main')?.innerText.slice(0, 2000)]);
      throw new Error(`event ${i} did not show within 30 s; the page shows: ${JSON.stringify(shown)}`);
    };
    const [e, s] = await Promise.all([get(events), get(seats)]);
    say({ seen: Number(i), events: e, seats: s });
  }
}
await browser.close();
process.exit(0);
