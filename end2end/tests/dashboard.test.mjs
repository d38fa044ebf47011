// The signed-in dashboard, driven in headless Chromium against a real node:
// sign-in, hydration, the Nodes page, people and the audit log, the Seats
// page's pause / resume / stop, its running turns and detached runs, the
// Events page and live updates from the node's event stream.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { mkdtempSync, writeFileSync, readFileSync, existsSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { createServer, connect } from 'node:net';
import { startNode, launchBrowser, strictPage, signIn, resultsDir, until } from '../lib/harness.mjs';

const ADMIN = { name: 'ada', password: 'admin-pass-1', role: 'admin' };
const OPERATOR = { name: 'olivia', password: 'operator-pass-1', role: 'operator' };
const VIEWER = { name: 'victor', password: 'viewer-pass-1', role: 'viewer' };

let node;
let browser;

before(async () => {
  node = await startNode({ people: [ADMIN, OPERATOR, VIEWER] });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  const code = await node?.stop();
  assert.equal(code, 0, `the node exits 0 on SIGTERM; its log:\n${node?.log()}`);
});

test('an operator signs in, the page hydrates and Settings › Nodes shows this node', async () => {
  const { page, context, problems } = await strictPage(browser);
  await signIn(page, node.url, OPERATOR.name, OPERATOR.password);
  await page.getByRole('heading', { name: 'Settings › Nodes' }).waitFor();
  const row = page.locator('tr[data-node="node-e2e"]');
  await row.waitFor();
  assert.match(await row.innerText(), /serving/);
  assert.match(await row.innerText(), /alpha-agent, beta-agent/);
  // A single node holds every seat: each listed with its epoch and since.
  await row.locator('details.seats summary').click();
  await row.locator('li[data-seat="alpha-agent"]').waitFor();
  const seat = await row.locator('li[data-seat="alpha-agent"]').innerText();
  assert.match(seat, /epoch 1 · since (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC)/);
  assert.match(await page.locator('.person').innerText(), /olivia/);
  await page.screenshot({ path: join(resultsDir, 'nodes-1280.png'), fullPage: true });
  for (const [path, heading] of [
    ['/seats', 'Seats'],
    ['/memory', 'Memory'],
    ['/events', 'Events'],
    ['/audit', 'Audit'],
  ]) {
    await page.goto(`${node.url}${path}`);
    await page.getByRole('heading', { name: heading, exact: true }).waitFor();
    await page.screenshot({ path: join(resultsDir, `${path.slice(1)}-1280.png`), fullPage: true });
  }
  assert.deepEqual(problems, []);
  await context.close();
});

test('a wrong password gets the same generic answer as an unknown name', async () => {
  const { page, context } = await strictPage(browser);
  for (const [name, password] of [
    [OPERATOR.name, 'wrong'],
    ['nobody-here', 'wrong'],
  ]) {
    await page.goto(`${node.url}/login`);
    await page.fill('#name', name);
    await page.fill('#password', password);
    await Promise.all([page.waitForURL(/error=/), page.click('button[type=submit]')]);
    assert.equal(
      await page.locator('[role=alert]').innerText(),
      'That name and password do not match. Try again.',
    );
  }
  await page.screenshot({ path: join(resultsDir, 'login-error.png') });
  await context.close();
});

test('a viewer sees adding a person disabled and is refused anyway; an admin adds one, who chooses a password at the first sign-in; both are audited', async () => {
  const viewer = await strictPage(browser);
  await signIn(viewer.page, node.url, VIEWER.name, VIEWER.password);
  await viewer.page.goto(`${node.url}/settings/people`);
  await viewer.page.waitForSelector('html[data-hydrated]');
  await viewer.page.getByText('Only admins may add people.').waitFor();
  assert.equal(await viewer.page.locator('form.inline-form button[type=submit]').isDisabled(), true);
  // The server refuses a viewer even when the page is bypassed.
  const refused = await viewer.page.evaluate(async () => {
    const r = await fetch('/api/add_person', {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: 'name=mallory&role=viewer',
    });
    return { status: r.status, body: await r.text() };
  });
  assert.equal(refused.status, 403);
  assert.match(refused.body, /victor is a viewer: only admins may add people\./);
  await viewer.context.close();

  const op = await strictPage(browser);
  await signIn(op.page, node.url, ADMIN.name, ADMIN.password);
  await op.page.goto(`${node.url}/settings/people`);
  await op.page.waitForSelector('html[data-hydrated]');
  await op.page.fill('#new-name', 'alice');
  await op.page.selectOption('#new-role', 'viewer');
  await op.page.click('form.inline-form:has(#new-name) button[type=submit]');
  const shown = await op.page.locator('[role=status] code').innerText();
  assert.equal(shown.length, 20, 'the generated password is shown once');
  const audit = op.page.locator('table.audit tbody');
  await audit.getByText('alice as viewer').waitFor();
  const text = await audit.innerText();
  assert.match(text, /victor\s+node-e2e\s+person\.add\s+mallory as viewer\s+refused: not an admin/);
  assert.match(text, /ada\s+node-e2e\s+person\.add[\s\S]*alice as viewer\s+ok/);
  await op.page.screenshot({ path: join(resultsDir, 'people-1280.png'), fullPage: true });
  await op.context.close();

  // The new person signs in with the password shown, and must choose
  // their own before anything else.
  const alice = await strictPage(browser);
  await alice.page.goto(`${node.url}/settings/nodes`);
  await alice.page.waitForURL(/\/login/);
  await alice.page.fill('#name', 'alice');
  await alice.page.fill('#password', shown);
  await Promise.all([alice.page.waitForURL(/\/account\/password/), alice.page.click('button[type=submit]')]);
  await alice.page.fill('#current', shown);
  await alice.page.fill('#new', 'alice chose this one');
  await alice.page.fill('#confirm', 'alice chose this one');
  await Promise.all([alice.page.waitForURL(/\/settings\/nodes/), alice.page.click('button[type=submit]')]);
  await alice.page.waitForSelector('html[data-hydrated]');
  assert.match(await alice.page.locator('.person').innerText(), /alice/);
  await alice.context.close();
});

test('after a correct sign-in, a next= that would leave the site lands on this node', async () => {
  const { page, context } = await strictPage(browser);
  // A tab after the first slash: browsers drop it and read `//host`.
  await page.goto(`${node.url}/login?next=/%09/127.0.0.1:3999/phish`);
  await page.waitForSelector('#name');
  await page.fill('#name', VIEWER.name);
  await page.fill('#password', VIEWER.password);
  await Promise.all([page.waitForURL(/\/settings\/nodes/), page.click('button[type=submit]')]);
  const landed = new URL(page.url());
  assert.equal(landed.origin, new URL(node.url).origin, `landed on ${page.url()}`);
  assert.equal(landed.pathname, '/settings/nodes');
  await context.close();
});

test("a node's page, reached from its id on Nodes and on Seats, shows its status, the seats it holds linked to their pages, and its recent events", async () => {
  const { page, context, problems } = await strictPage(browser);
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  await page.waitForSelector('html[data-hydrated]');
  await page.locator('tr[data-node="node-e2e"] a.node-link').click();
  await until('the node page', () => page.url().endsWith('/nodes/node-e2e'));
  await page.getByRole('heading', { name: 'Node node-e2e' }).waitFor();
  assert.equal(await page.title(), 'node-e2e · Nodes · node-e2e · Crewlet node');
  const facts = page.locator('dl.facts[data-node="node-e2e"]');
  await facts.waitFor();
  assert.match(await facts.innerText(), /serving/);
  assert.match(await facts.innerText(), /e2e/, 'its labels');
  await page.getByRole('heading', { name: 'Seats it holds (2)' }).waitFor();
  await page.locator('ol.node-events li[data-event="seat_claimed"]').first().waitFor();
  await page.screenshot({ path: join(resultsDir, 'node-1440.png'), fullPage: true });
  await page.locator('ul.held-seats a.seat-link', { hasText: 'alpha-agent' }).click();
  await until('the seat page', () => page.url().endsWith('/seats/alpha-agent'));
  await page.getByRole('heading', { name: 'Seat alpha-agent' }).waitFor();
  // The seat's holder links back to the node.
  await page.locator('tr[data-seat="alpha-agent"] a.node-link').click();
  await until('the node page again', () => page.url().endsWith('/nodes/node-e2e'));
  await page.goto(`${node.url}/nodes/node-gone`);
  await page.locator('[data-node-absent="node-gone"]').waitFor();
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${node.url}/nodes/node-e2e`);
  await facts.waitFor();
  await page.screenshot({ path: join(resultsDir, 'node-390.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('the Nodes page is readable at 390 px wide', async () => {
  const { page, context, problems } = await strictPage(browser, { width: 390, height: 844 });
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  await page.locator('tr[data-node="node-e2e"]').waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at 390 px`);
  // A card per node: its presence and seats are on screen, not behind a sideways scroll.
  for (const label of ['Presence', 'Seats']) {
    const box = await page.locator(`tr[data-node="node-e2e"] td[data-label="${label}"]`).boundingBox();
    assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `${label} is within the 390 px screen: ${JSON.stringify(box)}`);
  }
  await page.screenshot({ path: join(resultsDir, 'nodes-390.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('signing out ends the session', async () => {
  const { page, context } = await strictPage(browser);
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  await Promise.all([page.waitForURL(/\/login\?signed_out=1$/), page.click('form.signout button')]);
  await page.getByText('You signed out.').waitFor();
  await page.goto(`${node.url}/settings/nodes`);
  await page.waitForURL(/\/login\?next=/);
  await context.close();
});

test('a session ended in another tab: the open page says so and goes to sign in, coming back where it was', async () => {
  const { page, context } = await strictPage(browser);
  await signIn(page, node.url, OPERATOR.name, OPERATOR.password);
  await page.goto(`${node.url}/seats?state=attached`);
  await page.waitForSelector('html[data-hydrated]');
  await page.locator('.live.live-open').waitFor();
  const other = await context.newPage();
  await other.goto(`${node.url}/events`);
  await other.waitForSelector('html[data-hydrated]');
  await Promise.all([other.waitForURL(/signed_out=1/), other.click('form.signout button')]);
  // The open page's stream ends with the session: it notices by itself.
  await page.waitForURL(/\/login\?next=\/seats%3Fstate%3Dattached&ended=1$/, { timeout: 30000 });
  await page.locator('[data-session-ended]').waitFor();
  await page.fill('#name', OPERATOR.name);
  await page.fill('#password', OPERATOR.password);
  await Promise.all([page.waitForURL(/\/seats\?state=attached$/), page.click('button[type=submit]')]);
  await page.waitForSelector('html[data-hydrated]');
  // An action after the session ended elsewhere says so instead of "could not be reached".
  await Promise.all([other.waitForURL(/signed_out=1/), (async () => {
    await other.goto(`${node.url}/events`);
    await other.waitForSelector('html[data-hydrated]');
    await other.click('form.signout button');
  })()]);
  const answer = await page.evaluate(async () => {
    const r = await fetch('/api/whoami', { method: 'POST' });
    return { status: r.status, body: await r.text() };
  });
  assert.deepEqual(answer, { status: 401, body: '"NotSignedIn"' });
  await context.close();
});

test('each page has its own title and is marked in the menu, a skip link leads to the content, and dark mode follows the browser', async () => {
  const { page, context, problems } = await strictPage(browser);
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  for (const [path, title, menu] of [
    ['/settings/nodes', 'Nodes · node-e2e · Crewlet node', 'Nodes'],
    ['/seats', 'Seats · node-e2e · Crewlet node', 'Seats'],
    ['/seats/alpha-agent', 'alpha-agent · Seats · node-e2e · Crewlet node', 'Seats'],
    ['/events', 'Events · node-e2e · Crewlet node', 'Events'],
    ['/audit', 'Audit · node-e2e · Crewlet node', 'Audit'],
  ]) {
    await page.goto(`${node.url}${path}`);
    await page.waitForSelector('html[data-hydrated]');
    await until(`${path} titled`, async () => (await page.title()) === title);
    assert.deepEqual(await page.locator('nav a[aria-current="page"]').allInnerTexts(), [menu], path);
  }
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
  await page.keyboard.press('Enter');
  await until('focus in the content', () => page.evaluate(() => document.activeElement.id === 'main'));
  const dark = await browser.newContext({ colorScheme: 'dark', viewport: { width: 1440, height: 900 } });
  const night = await dark.newPage();
  await signIn(night, node.url, VIEWER.name, VIEWER.password);
  await night.goto(`${node.url}/seats`);
  await night.waitForSelector('html[data-hydrated]');
  const bg = await night.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
  assert.equal(bg, 'rgb(15, 20, 26)', 'the dark background');
  await night.screenshot({ path: join(resultsDir, 'seats-dark-1440.png'), fullPage: true });
  await dark.close();
  assert.deepEqual(problems, []);
  await context.close();
});

test('times read relative on the browser\'s clock with the local time and zone on hover, and a UTC switch is remembered', async () => {
  const context = await browser.newContext({ timezoneId: 'America/Los_Angeles', viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  await page.goto(`${node.url}/seats`);
  await page.waitForSelector('html[data-hydrated]');
  const since = page.locator('tr[data-seat="alpha-agent"] time.when').first();
  await until('the time read on the browser\'s clock', async () => /America\/Los_Angeles/.test((await since.getAttribute('title')) ?? ''));
  const utcAt = await since.getAttribute('datetime');
  const title = await since.getAttribute('title');
  // The hover is the same moment on Los Angeles's clock (UTC−08:00 in December).
  const local = new Date(Date.parse(utcAt) - 8 * 3600 * 1000).toISOString().slice(0, 19).replace('T', ' ');
  assert.equal(title, `${local} America/Los_Angeles (UTC−08:00)`);
  assert.match(await since.innerText(), /^(?:just now|\d+ s ago|\d+ min ago|\d+ h ago|\d{4}-\d\d-\d\d \d\d:\d\d)$/);
  // Switched to UTC, and still on UTC after a reload.
  await page.getByRole('button', { name: 'Times: local' }).click();
  await until('the time on UTC', async () => (await since.getAttribute('title')) === `${utcAt.slice(0, 19).replace('T', ' ')} UTC`);
  await page.reload();
  await page.waitForSelector('html[data-hydrated]');
  await page.getByRole('button', { name: 'Times: UTC' }).waitFor();
  await until('UTC after the reload', async () => (await page.locator('tr[data-seat="alpha-agent"] time.when').first().getAttribute('title'))?.endsWith(' UTC'));
  await page.screenshot({ path: join(resultsDir, 'seats-los-angeles-1280.png'), fullPage: true });
  await context.close();
});

/** Open `path` signed in and wait until the page follows the event stream. */
async function livePage(who, path, viewport) {
  const p = await strictPage(browser, viewport);
  await signIn(p.page, node.url, who.name, who.password);
  await p.page.goto(`${node.url}${path}`);
  await p.page.waitForSelector('html[data-hydrated]');
  await p.page.locator('.live.live-open').waitFor();
  return p;
}

/** Call a server function from inside the page (same origin, its session). */
async function serverFn(page, name, form) {
  return page.evaluate(
    async ({ name, body }) => {
      const r = await fetch(`/api/${name}`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body,
      });
      return { status: r.status, body: await r.text() };
    },
    { name, body: new URLSearchParams(form).toString() },
  );
}

test('an operator pauses a seat from the Seats page: it turns paused live, here and for a viewer, the audit has it, and a resume brings it back', async (t) => {
  const op = await livePage(OPERATOR, '/seats');
  const viewer = await livePage(VIEWER, '/seats');
  const row = (p) => p.locator('tr[data-seat="alpha-agent"]');
  assert.equal(await row(op.page).getAttribute('data-state'), 'attached');
  assert.match(await row(op.page).innerText(), /node-e2e[\s\S]*since (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC) · epoch 1/);
  // Neither page may reload: a reload would clear these marks. A row that
  // does not change keeps its element (and so its place and focus).
  for (const p of [op.page, viewer.page]) {
    await p.evaluate(() => {
      window.__sameDocument = true;
      document.querySelector('tr[data-seat="beta-agent"]').__kept = true;
    });
  }
  // The viewer's page notes when its row turns paused.
  await viewer.page.evaluate(() => {
    const seen = () => document.querySelector('tr[data-seat="alpha-agent"]')?.getAttribute('data-state');
    new MutationObserver(() => {
      if (seen() === 'paused' && !window.__pausedAt) window.__pausedAt = Date.now();
    }).observe(document.body, { subtree: true, childList: true, attributes: true });
    // A second listener notes when the event itself reaches the browser.
    window.__probe = new EventSource('/api/events');
    window.__probe.addEventListener('seat_paused', () => (window.__eventAt ??= Date.now()));
  });
  await viewer.page.waitForFunction(() => window.__probe.readyState === 1);

  await row(op.page).locator('button[data-action="pause"]').click();
  const dialog = op.page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  const asked = await dialog.innerText();
  assert.match(asked, /Pause alpha-agent\?/);
  assert.match(asked, /node-e2e holds it/);
  await dialog.locator('#confirm-reason').fill('rotating the e2e keys');
  await dialog.locator('#confirm-stop').check();
  const clickedAt = await op.page.evaluate(() => Date.now());
  await dialog.getByRole('button', { name: 'Pause', exact: true }).click();

  await op.page.locator('tr[data-seat="alpha-agent"][data-state="paused"]').waitFor();
  const paused = await row(op.page).innerText();
  assert.match(paused, /paused by olivia · (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC) · rotating the e2e keys · turn stopped/);
  assert.match(await op.page.locator('[role=status][data-result="alpha-agent"]').innerText(), /alpha-agent: paused; the running turn stops at its next round/);
  // The viewer's page follows without a reload, its buttons disabled.
  await viewer.page.locator('tr[data-seat="alpha-agent"][data-state="paused"]').waitFor();
  const { pausedAt, eventAt } = await viewer.page.evaluate(() => {
    window.__probe.close();
    return { pausedAt: window.__pausedAt, eventAt: window.__eventAt };
  });
  t.diagnostic(
    `click → event in the viewer's browser: ${eventAt - clickedAt} ms; event → row shows paused: ${pausedAt - eventAt} ms (150 ms coalescing + refetch + render)`,
  );
  await op.page.screenshot({ path: join(resultsDir, 'seats-1280.png'), fullPage: true });

  // The audit log has it, with the reason and the result.
  const audit = await strictPage(browser);
  await signIn(audit.page, node.url, OPERATOR.name, OPERATOR.password);
  await audit.page.goto(`${node.url}/audit`);
  const pauseRow = audit.page.locator('table.audit tr[data-action="seat.pause"]').first();
  await pauseRow.waitFor();
  assert.match(await pauseRow.innerText(), /olivia\s+node-e2e\s+seat\.pause\s+alpha-agent\s+rotating the e2e keys\s+paused; the running turn stops at its next round/);
  await audit.page.locator('.live.live-open').waitFor();

  // Resume, reached from the keyboard: Escape leaves the dialog without acting.
  const resume = row(op.page).locator('button[data-action="resume"]');
  await resume.focus();
  await op.page.keyboard.press('Enter');
  await dialog.waitFor();
  assert.match(await dialog.innerText(), /Resume alpha-agent\?[\s\S]*node-e2e holds it/);
  await op.page.keyboard.press('Escape');
  await op.page.locator('dialog.confirm[open]').waitFor({ state: 'detached' }).catch(() => {});
  await until('the dialog to close', async () => !(await op.page.locator('dialog.confirm').evaluate((d) => d.open)));
  assert.equal(await row(op.page).getAttribute('data-state'), 'paused', 'Escape did nothing');
  await resume.focus();
  await op.page.keyboard.press('Enter');
  await dialog.waitFor();
  await dialog.getByRole('button', { name: 'Resume', exact: true }).click();
  await op.page.locator('tr[data-seat="alpha-agent"][data-state="attached"]').waitFor();
  await viewer.page.locator('tr[data-seat="alpha-agent"][data-state="attached"]').waitFor();
  // The audit page saw the resume live.
  await audit.page.locator('table.audit tr[data-action="seat.resume"]').first().waitFor();
  assert.match(await audit.page.locator('table.audit tr[data-action="seat.resume"]').first().innerText(), /olivia\s+node-e2e\s+seat\.resume\s+alpha-agent\s+resumed/);
  await audit.page.screenshot({ path: join(resultsDir, 'audit-1280.png'), fullPage: true });

  for (const p of [op.page, viewer.page]) {
    assert.equal(await p.evaluate(() => window.__sameDocument), true);
    assert.equal(await p.evaluate(() => document.querySelector('tr[data-seat="beta-agent"]').__kept), true);
  }
  assert.deepEqual(op.problems, []);
  assert.deepEqual(viewer.problems, []);
  assert.deepEqual(audit.problems, []);
  for (const c of [op.context, viewer.context, audit.context]) await c.close();
});

test('a viewer sees the seat actions disabled and is refused anyway', async () => {
  const { page, context, problems } = await livePage(VIEWER, '/seats');
  const buttons = page.locator('tr[data-seat="beta-agent"] button');
  assert.equal(await buttons.count(), 3);
  for (let i = 0; i < 3; i++) assert.equal(await buttons.nth(i).isDisabled(), true);
  await page.getByText('only operators may pause, resume, stop or move seats').waitFor();
  const refused = await serverFn(page, 'pause_seat', { handle: 'beta-agent', reason: 'curious' });
  assert.equal(refused.status, 403);
  assert.match(refused.body, /victor is a viewer: only operators may pause a seat\./);
  // The node searches and filters: the address carries the query.
  await page.fill('#seat-q', 'beta');
  await Promise.all([page.waitForURL(/\/seats\?q=beta/), page.getByRole('button', { name: 'Filter' }).click()]);
  await page.locator('tr[data-seat="alpha-agent"]').waitFor({ state: 'detached' });
  assert.equal(await page.locator('tr[data-seat="beta-agent"]').count(), 1);
  await page.selectOption('#seat-state', 'paused');
  await Promise.all([page.waitForURL(/state=paused/), page.getByRole('button', { name: 'Filter' }).click()]);
  await page.getByText('No seat matches.').waitFor();
  // Audit: the refusal is marked, and refusals, the person and the action filter in the address.
  await page.goto(`${node.url}/audit`);
  await page.waitForSelector('html[data-hydrated]');
  await page.check('input[name="refused"]');
  await page.fill('input[name="person"]', 'victor');
  await Promise.all([page.waitForURL(/\/audit\?person=victor&refused=1/), page.getByRole('button', { name: 'Filter' }).click()]);
  const rows = page.locator('table.audit tbody tr');
  // The filtered table replaces the unfiltered one: read every row in one look once it has.
  const shown = await until('the audit table filtered to victor\'s refusals', async () => {
    const all = await rows.evaluateAll((trs) =>
      trs.map((tr) => ({ refused: tr.getAttribute('data-refused'), text: tr.innerText })));
    return all.length >= 1 && all.every((r) => r.refused === 'true' && /victor/.test(r.text)) && all;
  });
  assert.ok(shown.length >= 1);
  assert.match(await rows.first().getAttribute('class'), /sev-error/);
  await rows.first().locator('td[data-label="What"] a.filter-link').click();
  await until('the action filter', () => /\/audit\?action=seat\.pause$/.test(page.url()));
  await page.locator('table.audit tbody tr[data-action="seat.pause"]').first().waitFor();
  await page.screenshot({ path: join(resultsDir, 'audit-filtered-1440.png'), fullPage: true });
  // The refusal itself is the one error the browser logs.
  assert.deepEqual(problems.filter((p) => !/status of 403/.test(p)), []);
  await context.close();
});

test('the Events page shows events live, filters them, and holds them while reading is paused', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/events');
  const done = await serverFn(page, 'pause_seat', { handle: 'beta-agent', reason: 'watching events' });
  assert.equal(done.status, 200, done.body);
  const pausedRow = page.locator('tr[data-event="seat_paused"]', { hasText: 'beta-agent' }).first();
  await pausedRow.waitFor();
  assert.match(await pausedRow.innerText(), /seat_paused\s+node-e2e\s+beta-agent\s+by=olivia · reason=watching events/);

  // Filter by type, seat and node: each a part of the address.
  await page.selectOption('#event-type', 'seat_resumed');
  await pausedRow.waitFor({ state: 'detached' });
  await page.waitForURL(/\/events\?type=seat_resumed$/);
  await page.selectOption('#event-type', 'seat_paused');
  await pausedRow.waitFor();
  const filter = async (id, value) => {
    await page.fill(id, value);
    await page.press(id, 'Enter');
  };
  await filter('#event-seat', 'alpha-agent');
  await pausedRow.waitFor({ state: 'detached' });
  await filter('#event-seat', 'beta-agent');
  await pausedRow.waitFor();
  await page.waitForURL(/type=seat_paused&seat=beta-agent/);
  await filter('#event-node', 'some-other-node');
  await pausedRow.waitFor({ state: 'detached' });
  await filter('#event-node', '');
  await filter('#event-seat', '');
  await page.selectOption('#event-type', '');
  await page.waitForURL(/\/events$/);

  // Pause reading: what arrives is held, not shown, until reading resumes.
  await page.getByRole('button', { name: 'Pause reading' }).click();
  assert.equal((await serverFn(page, 'resume_seat', { handle: 'beta-agent' })).status, 200);
  const held = page.getByRole('button', { name: /Resume reading \([1-9]\d* new\)/ });
  await held.waitFor();
  const resumedRow = page.locator('tr[data-event="seat_resumed"]', { hasText: 'beta-agent' });
  assert.equal(await resumedRow.count(), 0, 'held while reading is paused');
  await held.click();
  await resumedRow.first().waitFor();
  // Newest on top.
  const order = await page.locator('table.events tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.event));
  assert.ok(order.indexOf('seat_resumed') < order.indexOf('seat_paused'), order.join(', '));
  await filter('#event-seat', 'beta-agent');
  await page.screenshot({ path: join(resultsDir, 'events-1280.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('a reload of the Events page keeps the events, kept by the node, with the filters in the address', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/events?seat=beta-agent');
  const done = await serverFn(page, 'pause_seat', { handle: 'beta-agent', reason: 'before the reload' });
  assert.equal(done.status, 200, done.body);
  const row = page.locator('tr[data-event="seat_paused"]', { hasText: 'before the reload' }).first();
  await row.waitFor();
  const id = await row.getAttribute('data-id');
  await page.reload();
  await page.waitForSelector('html[data-hydrated]');
  // Rendered from what the node kept (the stream opened after the reload).
  await page.locator(`tr[data-event="seat_paused"][data-id="${id}"]`).waitFor();
  assert.equal(await page.inputValue('#event-seat'), 'beta-agent');
  assert.equal(
    await page.locator('tr[data-event]:not([data-event*="beta"])').filter({ hasNotText: 'beta-agent' }).count(),
    0,
    'only beta-agent rows under the seat filter',
  );
  // A row opens to its fields; a seat in a row is a filter.
  await row.locator('summary').click();
  assert.match(await row.locator('pre.fields').innerText(), /"reason": "before the reload"/);
  assert.equal((await serverFn(page, 'resume_seat', { handle: 'beta-agent' })).status, 200);
  assert.deepEqual(problems, []);
  await context.close();
});

test("a seat's page shows its story from before it was opened, and a message sent there is answered there", async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats');
  // Before the page opens: a turn answered, a pause and a resume.
  assert.equal((await publish(page, 'alpha-agent', { id: 'story-1', type: 'task_assigned', body: { text: 'first' } })).status, 200);
  await until('story-1 answered', async () => {
    const r = await page.evaluate(async () => (await fetch('/api/seats/alpha-agent/outbox')).json());
    return r.effects.some((e) => e.trigger_ids.includes('story-1'));
  });
  assert.equal((await serverFn(page, 'pause_seat', { handle: 'alpha-agent', reason: 'story pause' })).status, 200);
  assert.equal((await serverFn(page, 'resume_seat', { handle: 'alpha-agent' })).status, 200);
  // Reached from the Seats page: the handle links there.
  await page.locator('tr[data-seat="alpha-agent"] a.seat-link').click();
  await page.waitForURL(/\/seats\/alpha-agent$/);
  await page.waitForSelector('html[data-hydrated]');
  await page.getByRole('heading', { name: 'Seat alpha-agent' }).waitFor();
  const timeline = page.locator('ol.timeline-items');
  await timeline.locator('li[data-title="paused by olivia"]', { hasText: 'story pause' }).waitFor();
  assert.match(await timeline.innerText(), /turn completed/);
  assert.match(await timeline.innerText(), /olivia: seat pause/);
  assert.match(await page.locator('ol.effects').innerText(), /echo of story-1/);
  // The seat's row with its actions is on the page too.
  await page.locator('tr[data-seat="alpha-agent"] button[data-action="pause"]').waitFor();
  // A message from the page: the seat's answer appears there, live.
  await page.locator('.live.live-open').first().waitFor();
  await page.fill('#seat-message', 'hello from the seat page');
  await page.getByRole('button', { name: 'Send' }).click();
  const sent = page.locator('[data-sent]');
  await sent.waitFor();
  const id = await sent.getAttribute('data-sent');
  await page.locator('ol.effects li.effect', { hasText: `echo of ${id}` }).waitFor();
  assert.equal(await page.inputValue('#seat-message'), '', 'the box is cleared once sent');
  // The last hour charts its turns, a bar a minute.
  const hour = page.locator('section.last-hour');
  await until('the last hour to count the turns', async () => Number(await hour.getAttribute('data-turns')) >= 2);
  assert.equal(await hour.locator('svg.chart rect.bar').count(), 60);
  assert.match(await hour.innerText(), /\d+ turns in the last hour/);
  await page.screenshot({ path: join(resultsDir, 'seat-1280.png'), fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: join(resultsDir, 'seat-390.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test("a seat's page charts its inbox depth as its holder sampled it: mail a pause holds shows, and drains once resumed", async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats');
  assert.equal((await serverFn(page, 'pause_seat', { handle: 'beta-agent', reason: 'hold the mail' })).status, 200);
  for (const id of ['held-1', 'held-2']) {
    assert.equal((await publish(page, 'beta-agent', { id, type: 'task_assigned', body: { text: id } })).status, 200);
  }
  // The holder samples on the sweep's cadence; the page reads the hour as it opens.
  const depth = page.locator('section.last-hour figure.inbox-depth');
  await until('the inbox depth chart to show the two held messages', async () => {
    await page.goto(`${node.url}/seats/beta-agent`);
    await page.waitForSelector('html[data-hydrated]');
    return Number(await depth.getAttribute('data-deepest')) >= 2;
  });
  assert.match(await depth.innerText(), /2 messages waiting at the last sample/);
  assert.ok((await depth.locator('svg.chart circle.dot').count()) >= 1, 'a sampled minute is a dot');
  assert.equal((await serverFn(page, 'resume_seat', { handle: 'beta-agent' })).status, 200);
  await until('the inbox drained in the chart', async () => {
    await page.goto(`${node.url}/seats/beta-agent`);
    await page.waitForSelector('html[data-hydrated]');
    return /0 messages waiting at the last sample, at most 2 messages in the hour/.test(await depth.innerText());
  });
  await page.screenshot({ path: join(resultsDir, 'seat-inbox-1280.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('Settings › Nodes has a strip per node for its last hour: the seats it held, its turns and its store p99', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/settings/nodes');
  assert.equal((await publish(page, 'alpha-agent', { id: 'strip-1', type: 'task_assigned', body: { text: 'count me' } })).status, 200);
  const strip = page.locator('.node-strips li.strip[data-node="node-e2e"]');
  await until('the strip to show the seats held and a turn', async () => {
    await page.goto(`${node.url}/settings/nodes`);
    await page.waitForSelector('html[data-hydrated]');
    const text = await strip.innerText();
    return /Seats held: 2 now/.test(text) && Number(await strip.getAttribute('data-turns')) >= 1 && /Store p99: \d/.test(text);
  });
  assert.equal(await strip.locator('svg.chart rect.bar').count(), 60, 'a turn bar a minute');
  assert.ok((await strip.locator('svg.chart circle.dot').count()) >= 2, 'seats held and the store p99 as dots');
  await strip.locator('a', { hasText: 'node-e2e' }).waitFor();
  await page.screenshot({ path: join(resultsDir, 'nodes-strips-1280.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('the Seats page is readable at 390 px wide', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats', { width: 390, height: 844 });
  await page.locator('tr[data-seat="alpha-agent"]').waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at 390 px`);
  // Each seat is a card whose fields and buttons fit the screen.
  const box = await page.locator('tr[data-seat="alpha-agent"] button[data-action="pause"]').boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 390, JSON.stringify(box));
  await page.screenshot({ path: join(resultsDir, 'seats-390.png'), fullPage: true });
  // No turn runs: Stop turn is disabled, saying why.
  const stop = page.locator('tr[data-seat="alpha-agent"] button[data-action="stop"]');
  assert.equal(await stop.isDisabled(), true);
  assert.equal(await stop.getAttribute('title'), 'No turn is running');
  await page.locator('tr[data-seat="alpha-agent"] button[data-action="pause"]').click();
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  assert.match(await dialog.innerText(), /alpha-agent[\s\S]*node-e2e holds it/);
  await page.screenshot({ path: join(resultsDir, 'seats-confirm-390.png') });
  await page.keyboard.press('Escape');
  await dialog.waitFor({ state: 'detached' });
  assert.deepEqual(problems, []);
  await context.close();
});

test('the Seats page keeps every action on screen at 720 px and on one line at 1440 px', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats', { width: 720, height: 900 });
  const row = page.locator('tr[data-seat="alpha-agent"]');
  await row.waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at 720 px`);
  for (const action of ['pause', 'stop', 'move']) {
    const box = await row.locator(`button[data-action="${action}"]`).boundingBox();
    assert.ok(box && box.x >= 0 && box.x + box.width <= 720, `${action} is on screen at 720 px: ${JSON.stringify(box)}`);
  }
  await page.screenshot({ path: join(resultsDir, 'seats-720.png'), fullPage: true });
  await page.setViewportSize({ width: 1440, height: 900 });
  const tops = [];
  for (const action of ['pause', 'stop', 'move']) tops.push((await row.locator(`button[data-action="${action}"]`).boundingBox()).y);
  assert.ok(Math.max(...tops) - Math.min(...tops) < 4, `the three actions share one line at 1440 px: ${tops}`);
  await page.screenshot({ path: join(resultsDir, 'seats-1440.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('keyboard only: pause a seat, confirm, and the focus comes back to its row; the same for the resume', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats');
  const row = page.locator('tr[data-seat="beta-agent"]');
  await row.locator('button[data-action="pause"]').waitFor();
  // Tab from the top of the page to the seat's Pause button.
  await page.locator('a.skip').focus();
  await until('Tab to reach the Pause button of beta-agent', async () => {
    await page.keyboard.press('Tab');
    return page.evaluate(() => document.activeElement?.dataset.action === 'pause' && document.activeElement.closest('tr')?.dataset.seat === 'beta-agent');
  });
  await page.keyboard.press('Enter');
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  // The confirmation takes the focus once it is drawn.
  const inDialog = () => page.evaluate(() => !!document.activeElement?.closest('dialog.confirm[open]') && document.activeElement.tagName !== 'DIALOG');
  await until('the focus in the pause confirmation', inDialog);
  await page.keyboard.type('keyboard pause');
  await page.keyboard.press('Enter');
  await row.locator('button[data-action="resume"]').waitFor();
  const focused = () => page.evaluate(() => [document.activeElement?.closest('tr')?.dataset.seat, document.activeElement?.dataset.action]);
  await until('the focus back on the row (its Resume)', async () => JSON.stringify(await focused()) === JSON.stringify(['beta-agent', 'resume']));
  await page.keyboard.press('Enter');
  await dialog.waitFor();
  await until('the focus in the resume confirmation', inDialog);
  await page.keyboard.press('Enter');
  await row.locator('button[data-action="pause"]').waitFor();
  await until('the focus back on the row (its Pause)', async () => JSON.stringify(await focused()) === JSON.stringify(['beta-agent', 'pause']));
  const audit = await serverFn(page, 'audit_log', { seat: 'beta-agent', action: 'seat.pause' });
  assert.match(audit.body, /keyboard pause/);
  assert.deepEqual(problems, []);
  await context.close();
});

test('the Nodes page shows a new seat without a reload when a company adds one', async () => {
  const { page, context, problems } = await livePage(ADMIN, '/settings/nodes');
  await page.evaluate(() => (window.__sameDocument = true));
  const row = page.locator('tr[data-node="node-e2e"]');
  await row.locator('details.seats summary').click();
  await row.locator('li[data-seat="alpha-agent"]').waitFor();
  assert.match(await row.locator('details.seats summary').innerText(), /^2 seats$/);
  const company = ['alpha-agent', 'beta-agent', 'gamma-agent']
    .map((h) => `[[roles]]\nhandle = "${h}"\nagent = { kind = "echo" }\n`)
    .join('\n');
  const applied = await page.evaluate(async (body) => {
    const r = await fetch('/api/company', { method: 'POST', body });
    return { status: r.status, body: await r.text() };
  }, `[company]\nname = "End-to-end company"\n\n${company}`);
  assert.equal(applied.status, 200, applied.body);
  // The seat list stays open while the page refreshes itself.
  await row.locator('li[data-seat="gamma-agent"]').waitFor();
  assert.match(await row.locator('details.seats summary').innerText(), /^3 seats$/);
  assert.match(await row.locator('li[data-seat="gamma-agent"]').innerText(), /epoch 1 · since (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC)/);
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'no reload');
  await page.screenshot({ path: join(resultsDir, 'nodes-live-1280.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('the live badge says reconnecting while the node is away, and the node stops with streams open', async () => {
  const other = await startNode({ id: 'node-e2e-away', people: [OPERATOR] });
  try {
    const { page, context } = await strictPage(browser);
    await signIn(page, other.url, OPERATOR.name, OPERATOR.password);
    await page.goto(`${other.url}/seats`);
    await page.locator('.live.live-open').waitFor();
    const code = await other.stop();
    assert.equal(code, 0, `the node exits 0 with an event stream open; its log:\n${other.log()}`);
    await page.locator('.live.live-reconnecting', { hasText: 'reconnecting…' }).waitFor();
    await page.screenshot({ path: join(resultsDir, 'seats-reconnecting-1280.png') });
    await context.close();
  } finally {
    await other.stop();
  }
});

/**
 * A TCP proxy in front of the node that the test can sever: `sever()` cuts
 * every connection and answers every new one with 503 (a node restarting
 * behind a load balancer), noting each refused event-stream request's path
 * in `refused`; `restore()` passes traffic again.
 */
async function severableProxy(target) {
  const { hostname, port } = new URL(target);
  const sockets = new Set();
  // The paths of the event-stream requests refused while severed.
  const refused = [];
  let severed = false;
  const track = (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
  };
  const server = createServer((client) => {
    track(client);
    if (severed) {
      client.once('data', (chunk) => {
        const line = chunk.toString('latin1').split('\r\n')[0];
        if (line.startsWith('GET /api/events')) refused.push(line.split(' ')[1]);
        client.end('HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
      });
      return;
    }
    const upstream = connect(Number(port), hostname);
    track(upstream);
    client.pipe(upstream).pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    refused,
    sever() {
      severed = true;
      for (const s of sockets) s.destroy();
    },
    restore() {
      severed = false;
    },
    close() {
      severed = true;
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

test('when the event stream drops the pages say reconnecting and Nodes declines to guess; once it is back the Events page has what happened meanwhile', async () => {
  const proxy = await severableProxy(node.url);
  try {
    const { page: events, context, problems } = await strictPage(browser);
    await signIn(events, proxy.url, OPERATOR.name, OPERATOR.password);
    const nodes = await context.newPage();
    await nodes.goto(`${proxy.url}/settings/nodes`);
    await events.goto(`${proxy.url}/events`);
    for (const p of [events, nodes]) {
      await p.waitForSelector('html[data-hydrated]');
      await p.locator('.live.live-open').waitFor();
    }
    const row = nodes.locator('tr[data-node="node-e2e"]');
    assert.equal(await row.getAttribute('data-status'), 'serving');
    // One event seen before the drop, so the page has an id to resume from.
    const direct = await livePage(OPERATOR, '/seats');
    assert.equal((await serverFn(direct.page, 'pause_seat', { handle: 'beta-agent', reason: 'before the drop' })).status, 200);
    const beforeDrop = events.locator('tr[data-event="seat_paused"]', { hasText: 'before the drop' });
    await beforeDrop.waitFor();
    const dropId = Number(await beforeDrop.getAttribute('data-id'));

    proxy.sever();
    for (const p of [events, nodes]) {
      await p.locator('.live.live-reconnecting', { hasText: 'reconnecting…' }).waitFor();
    }
    // Nodes: the last roster greyed, every status unknown, as of its read.
    await nodes.locator('tr[data-node="node-e2e"][data-status="unknown"]').waitFor();
    assert.match(await row.innerText(), /unknown[\s\S]*serving as of (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC)/);
    assert.match(await nodes.locator('[data-stale="true"]').innerText(), /live event stream from the node is lost/);
    await nodes.screenshot({ path: join(resultsDir, 'nodes-reconnecting-1280.png'), fullPage: true });

    // What happens while the stream is away (the browser's retries get 503,
    // so it opens new streams, each asking for what came after its last id).
    assert.equal((await serverFn(direct.page, 'resume_seat', { handle: 'beta-agent' })).status, 200);
    assert.equal((await serverFn(direct.page, 'pause_seat', { handle: 'beta-agent', reason: 'while away' })).status, 200);
    assert.equal((await serverFn(direct.page, 'resume_seat', { handle: 'beta-agent' })).status, 200);

    // The browser's own reconnect is refused (503), so it gives up and the
    // page opens a new stream, asking for what came after its last event.
    await until('the pages to open new streams asking for what they missed', () =>
      proxy.refused.filter((path) => /^\/api\/events\?last_event_id=\d+$/.test(path)).length >= 2,
      30000,
    );
    proxy.restore();
    for (const p of [events, nodes]) {
      await p.locator('.live.live-open').waitFor({ timeout: 45000 });
    }
    await events.locator('tr[data-event="seat_paused"]', { hasText: 'while away' }).waitFor();
    // The page also lists what the node kept from earlier: count after the drop.
    const resumes = await events
      .locator('tr[data-event="seat_resumed"]', { hasText: 'beta-agent' })
      .evaluateAll((rows) => rows.map((r) => Number(r.dataset.id)));
    assert.equal(resumes.filter((id) => id > dropId).length, 2, 'both resumes made while away are listed');
    assert.equal(await events.locator('tr[data-event="resync"]').count(), 0, 'replayed, not resynced');
    await nodes.locator('tr[data-node="node-e2e"][data-status="serving"]').waitFor();
    await events.screenshot({ path: join(resultsDir, 'events-after-reconnect-1280.png'), fullPage: true });
    assert.deepEqual(problems.filter((p) => !/503|Service Unavailable|ERR_|EventSource|event-stream/.test(p)), []);
    await direct.context.close();
    await context.close();
  } finally {
    await proxy.close();
  }
});

for (const [path, ready] of [
  ['/events', async (page) => {
    await page.locator('tr[data-event="seat_paused"]').first().waitFor();
  }],
  ['/audit', async (page) => {
    await page.locator('table.audit tbody tr').first().waitFor();
  }],
]) {
  test(`the ${path.slice(1)} page is readable at 390 px wide`, async () => {
    const { page, context, problems } = await livePage(OPERATOR, path, { width: 390, height: 844 });
    if (path === '/events') {
      const direct = await serverFn(page, 'pause_seat', { handle: 'beta-agent', reason: 'narrow screen' });
      assert.equal(direct.status, 200, direct.body);
      assert.equal((await serverFn(page, 'resume_seat', { handle: 'beta-agent' })).status, 200);
    }
    await ready(page);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at 390 px`);
    // Each row is a card: its cells fit the screen.
    const cells = await page.locator('table tbody tr:first-child td').evaluateAll((tds) =>
      tds.map((td) => { const r = td.getBoundingClientRect(); return { x: r.x, right: r.right }; }),
    );
    assert.ok(cells.length > 0);
    for (const c of cells) assert.ok(c.x >= 0 && c.right <= 390, JSON.stringify(cells));
    await page.screenshot({ path: join(resultsDir, `${path.slice(1)}-390.png`), fullPage: true });
    assert.deepEqual(problems, []);
    await context.close();
  });
}

test('the Memory page, reached from the keyboard, says which node answered for a seat and shows its echo turn live', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/memory');
  await page.locator('table.memory-overview tr[data-seat="alpha-agent"]').waitFor();
  // The overview lists every seat with who answered, and the coverage.
  assert.match(await page.locator('.coverage').innerText(), /Coverage: 1 of 1 holder answered — node-e2e \(this node\)\./);
  assert.match(await page.locator('table.memory-overview tr[data-seat="beta-agent"]').innerText(), /node-e2e/);
  // From the search box, Tab reaches the filter button, then the first seat.
  await page.locator('#memory-q').focus();
  await page.keyboard.press('Tab');
  await page.keyboard.press('Tab');
  const link = page.locator('table.memory-overview tr[data-seat="alpha-agent"] a');
  assert.equal(await link.evaluate((a) => a === document.activeElement), true, 'the seat link has the focus');
  const outline = await link.evaluate((a) => getComputedStyle(a).outlineStyle);
  assert.notEqual(outline, 'none', 'the focus is visible');
  await Promise.all([page.waitForURL(/\/memory\?seat=alpha-agent/), page.keyboard.press('Enter')]);
  const seat = page.locator('section.memory-seat[data-seat="alpha-agent"]');
  await seat.waitFor();
  assert.equal(await seat.getAttribute('data-state'), 'held');
  assert.equal(await seat.locator('.answered').innerText(), 'Answered by node-e2e (holder, epoch 1).');
  for (const kind of ['Diary', 'Episodes', 'Counterparty profiles', 'Skills', 'Skill versions', 'Onboarding markers', 'Conversations']) {
    await seat.getByRole('heading', { name: new RegExp(`^${kind} \\(\\d+\\)$`) }).waitFor();
  }

  // The echo agent runs a turn: its episode and diary note appear without a reload.
  await page.evaluate(() => (window.__sameDocument = true));
  const episodes = seat.locator('[data-kind="episodes"] tbody tr');
  const before = await episodes.count();
  const sent = await page.evaluate(async () => {
    const r = await fetch('/api/seats/alpha-agent/inbox', {
      method: 'POST',
      body: JSON.stringify({ id: 'evt-e2e-memory', type: 'task_assigned', body: { title: 'remember the end-to-end run' } }),
    });
    return { status: r.status, body: await r.text() };
  });
  assert.equal(sent.status, 200, sent.body);
  await until('the new episode to show', async () => (await episodes.count()) > before, 20000);
  assert.match(await seat.locator('[data-kind="diary"] tbody').innerText(), /\S/);
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'no reload');
  assert.equal(await seat.locator('.answered').innerText(), 'Answered by node-e2e (holder, epoch 1).');
  // The overview counts it too.
  const counts = page.locator('table.memory-overview tr[data-seat="alpha-agent"] td[data-label="Episodes"]');
  await until('the overview to count the episode', async () => Number(await counts.innerText()) >= before + 1);
  await page.screenshot({ path: join(resultsDir, 'memory-1280.png'), fullPage: true });

  // A seat nobody has: the sentence says so, from the node.
  await page.fill('#memory-seat', 'no-such-seat');
  await Promise.all([page.waitForURL(/seat=no-such-seat/), page.getByRole('button', { name: 'Read its memory' }).click()]);
  await page.locator('.notice-error', { hasText: 'seat "no-such-seat" is not in the active company' }).waitFor();
  assert.deepEqual(problems.filter((p) => !/status of 404/.test(p)), []);
  await context.close();
});

test('the Memory page is readable at 390 px wide', async () => {
  const { page, context, problems } = await livePage(VIEWER, '/memory?seat=alpha-agent', { width: 390, height: 844 });
  await page.locator('section.memory-seat[data-seat="alpha-agent"] .answered').waitFor();
  await page.locator('table.memory-overview tr[data-seat="alpha-agent"]').waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at 390 px`);
  // Rows are cards: each cell fits the screen.
  const box = await page.locator('table.memory-overview tr[data-seat="alpha-agent"] td[data-label="Episodes"]').boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 390, JSON.stringify(box));
  await page.screenshot({ path: join(resultsDir, 'memory-390.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('Settings › Nodes puts alarms on top: a seat no node may run, and an undead seat with how long', async () => {
  // A seat whose teardown cannot be proven, as a child stuck in the kernel
  // leaves it: the node's fault injection fails its release while the file
  // naming it exists (a child that only ignores SIGTERM is killed).
  const dir = mkdtempSync(join(tmpdir(), 'crewlet-e2e-stuck-'));
  const held = join(dir, 'held');
  writeFileSync(held, 'stuck-agent\n');
  const gpu = '[[roles]]\nhandle = "gpu-agent"\nagent = { kind = "echo" }\nplacement = { labels = ["gpu"] }\n';
  const stuck = '[[roles]]\nhandle = "stuck-agent"\nagent = { kind = "echo" }\n';
  // Teardowns are retried at each heartbeat: a short one clears the alarm soon.
  const heartbeat = '[coordination]\nheartbeat_seconds = 2\n';
  const other = await startNode({
    id: 'node-e2e-alarms',
    people: [ADMIN],
    roles: ['alpha-agent'],
    more: gpu + stuck + heartbeat,
    env: { CREWLET_FAULT_HOLD_TEARDOWN: held },
  });
  try {
    const { page, context, problems } = await strictPage(browser);
    await signIn(page, other.url, ADMIN.name, ADMIN.password);
    await page.locator('.live.live-open').waitFor();
    // The first placement pass finds it; its event brings the alarm.
    const unplaceable = page.locator('.alarms li[data-alarm="unplaceable"]');
    await unplaceable.waitFor({ timeout: 20000 });
    assert.match(
      await unplaceable.innerText(),
      /1 seat cannot be placed: gpu-agent\. No live node matches its placement: start a node with the node id or labels it needs, or change its placement\./,
    );
    // The alarms come before the nodes.
    const onTop = await page.evaluate(
      () => document.querySelector('.alarms').compareDocumentPosition(document.querySelector('table.nodes')) & Node.DOCUMENT_POSITION_FOLLOWING,
    );
    assert.ok(onTop, 'the alarms are on top');

    // The seat is held here before its role goes.
    await until('stuck-agent to be attached here', () => /seat_attached[^\n]{0,40}stuck-agent/.test(other.log()), 20000);
    await page.evaluate(() => (window.__sameDocument = true));
    const applied = await page.evaluate(async (body) => {
      const r = await fetch('/api/company', { method: 'POST', body });
      return { status: r.status, body: await r.text() };
    }, `[company]\nname = "End-to-end company"\n\n[[roles]]\nhandle = "alpha-agent"\nagent = { kind = "echo" }\n${gpu}`);
    assert.equal(applied.status, 200, applied.body);
    const undead = page.locator('.alarms li[data-alarm="unproven"][data-seat="stuck-agent"]');
    await undead.waitFor({ timeout: 20000 });
    assert.match(
      await undead.innerText(),
      /stuck-agent is undead on node-e2e-alarms: its teardown has been failing for \d+ s \(since (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC)\), epoch 1\. node-e2e-alarms keeps the lease/,
    );
    assert.match(await page.locator('.alarms h2').innerText(), /Alarms \(2\)/);
    await page.screenshot({ path: join(resultsDir, 'nodes-alarms-1280.png'), fullPage: true });

    // The fault lifted, the next retry proves the teardown: the alarm goes by itself.
    rmSync(held);
    await undead.waitFor({ state: 'detached', timeout: 20000 });
    assert.equal(await page.evaluate(() => window.__sameDocument), true, 'no reload');
    assert.deepEqual(problems, []);
    await context.close();
  } finally {
    await other.stop();
  }
});

/** A free loopback port. */
async function freePort() {
  const { createServer } = await import('node:net');
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** nats-server with JetStream, its store in `dir`. */
function startNats(port, dir) {
  const proc = spawn('nats-server', ['-js', '-sd', dir, '-a', '127.0.0.1', '-p', String(port)], { stdio: 'ignore' });
  const exited = new Promise((r) => proc.on('exit', r));
  return { proc, stop: (signal = 'SIGTERM') => (proc.exitCode === null && proc.kill(signal), exited) };
}

test('when the coordination store cannot be read, Settings › Nodes says unknown and greys the last roster with its time, then recovers by itself', async () => {
  const port = await freePort();
  const natsDir = mkdtempSync(join(tmpdir(), 'crewlet-e2e-nats-'));
  let nats = startNats(port, natsDir);
  const fleet = `[coordination]\ntype = "embedded-kv"\nstore_timeout_ms = 500\n\n[stream]\ntype = "nats"\nurls = ["nats://127.0.0.1:${port}"]\n`;
  let other;
  try {
    other = await startNode({ id: 'node-e2e-store', people: [OPERATOR], roles: ['alpha-agent'], more: fleet });
    const { page, context, problems } = await strictPage(browser);
    await signIn(page, other.url, OPERATOR.name, OPERATOR.password);
    const row = page.locator('tr[data-node="node-e2e-store"]');
    await page.locator('tr[data-node="node-e2e-store"][data-status="serving"]').waitFor();

    // The store goes away: the page, read again, declines to guess.
    await nats.stop('SIGKILL');
    await page.reload();
    await page.locator('[data-stale="true"]').waitFor();
    await page.waitForSelector('html[data-hydrated]');
    assert.match(await page.locator('[data-stale="true"]').innerText(), /Node states are unknown: the fleet's roster cannot be read right now[\s\S]*as of (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC)/);
    assert.equal(await row.getAttribute('data-status'), 'unknown');
    assert.match(await row.locator('.stale-note').innerText(), /^serving as of (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC)$/);
    assert.equal(await row.evaluate((tr) => tr.classList.contains('stale')), true, 'the row is greyed');
    await page.screenshot({ path: join(resultsDir, 'nodes-unknown-1280.png'), fullPage: true });

    // It comes back: the page reads the roster again by itself.
    await page.evaluate(() => (window.__sameDocument = true));
    nats = startNats(port, natsDir);
    await page.locator('tr[data-node="node-e2e-store"][data-status="serving"]').waitFor({ timeout: 30000 });
    assert.equal(await page.locator('[data-stale="true"]').count(), 0);
    assert.equal(await page.evaluate(() => window.__sameDocument), true, 'no reload');
    // The reads that failed while the store was away are the only errors.
    assert.deepEqual(problems.filter((p) => !/status of 503/.test(p)), []);
    await context.close();
  } finally {
    await other?.stop();
    await nats.stop();
  }
});

/** Publish a trigger to a seat's inbox from inside the page (its session). */
async function publish(page, handle, envelope) {
  return page.evaluate(
    async ({ handle, envelope }) => {
      const r = await fetch(`/api/seats/${handle}/inbox`, { method: 'POST', body: JSON.stringify(envelope) });
      return { status: r.status, body: await r.text() };
    },
    { handle, envelope },
  );
}

/** Collect the node's events of `name` in the page from now on (`window.__events`). */
async function collectEvents(page, name) {
  await page.evaluate(async (name) => {
    window.__events = [];
    const es = new EventSource('/api/events');
    es.addEventListener(name, (m) => window.__events.push(JSON.parse(m.data)));
    await new Promise((resolve) => es.addEventListener('open', resolve, { once: true }));
  }, name);
}

test('an operator stops a running turn from the seats page', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats');
  const row = page.locator('tr[data-seat="alpha-agent"]');
  await row.waitFor();
  await collectEvents(page, 'turn_completed');
  // A slow echo turn: 40 rounds half a second apart.
  const sent = await publish(page, 'alpha-agent', {
    id: 'evt-e2e-slow-turn',
    type: 'task_assigned',
    body: { title: 'a slow turn to stop', echo: { rounds: 40, round_delay_ms: 500 } },
  });
  assert.equal(sent.status, 200, sent.body);
  // The row says a turn is running, without a reload.
  const running = row.locator('.running-turn');
  await running.waitFor({ timeout: 20000 });
  const turnId = await running.getAttribute('data-turn');
  assert.ok(turnId, 'the running turn is named');
  assert.match(await running.innerText(), /running turn/);
  await page.screenshot({ path: join(resultsDir, 'seats-running-turn-1280.png'), fullPage: true });

  await row.locator('button[data-action="stop"]').click();
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  assert.match(await dialog.innerText(), /Stop alpha-agent's running turn\?[\s\S]*node-e2e holds it/);
  await dialog.getByRole('button', { name: 'Stop turn', exact: true }).click();
  await page.getByText('alpha-agent: stop requested').waitFor();

  // The turn ends stopped: the node says so on its event stream, and the row
  // no longer shows it running.
  const completed = await until(
    'turn_completed for the stopped turn',
    () => page.evaluate((id) => window.__events.find((e) => e.seat === 'alpha-agent' && e.turn_id === id), turnId),
    20000,
  );
  assert.equal(completed.outcome, 'stopped', JSON.stringify(completed));
  await running.waitFor({ state: 'detached' });
  assert.deepEqual(problems, []);
  await context.close();
});

test("the seats page shows a seat's detached runs with their state and launcher", async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats');
  const row = page.locator('tr[data-seat="beta-agent"]');
  await row.waitFor();
  assert.equal(await row.locator('.runs').count(), 0, 'no runs yet');
  await page.evaluate(() => (window.__sameDocument = true));
  const sent = await publish(page, 'beta-agent', {
    id: 'evt-e2e-detached-run',
    type: 'task_assigned',
    body: { title: 'start a long command', run: { argv: ['/bin/sleep', '30'] } },
  });
  assert.equal(sent.status, 200, sent.body);
  const runs = row.locator('.runs');
  await runs.waitFor({ timeout: 20000 });
  assert.equal(await runs.innerText(), '1 run: running on node-e2e');
  assert.equal(await runs.getAttribute('data-live-runs'), '1');
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'no reload');
  await page.screenshot({ path: join(resultsDir, 'seats-runs-1280.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('the priority order lists this node; an operator saves it and the audit has node_order.save; a viewer reads it without controls', async () => {
  const op = await livePage(OPERATOR, '/settings/nodes');
  const panel = op.page.locator('section.priority-order');
  const item = panel.locator('li[data-node="node-e2e"]');
  await item.waitFor();
  assert.match(await item.innerText(), /1\s*node-e2e/);
  assert.equal(await item.getAttribute('draggable'), 'true');
  // The only node can move neither up nor down.
  assert.equal(await item.locator('button[data-move="up"]').isDisabled(), true);
  assert.equal(await item.locator('button[data-move="down"]').isDisabled(), true);
  await panel.getByText('No order saved yet').waitFor();
  await panel.locator('button[data-action="save-order"]').click();
  await panel.locator('[data-order-set-by="olivia"]').waitFor();
  assert.match(await panel.innerText(), /Saved by olivia (?:just now|\d+ s ago|\d+ min ago|\d+ h ago|in \d+ (?:s|min)|\d\d:\d\d:\d\d UTC) \(revision \d+\)/);
  // Saved as shown: nothing to save until the order changes.
  await until('Save order disabled', () => panel.locator('button[data-action="save-order"]').isDisabled());
  await op.page.screenshot({ path: join(resultsDir, 'nodes-order-1280.png'), fullPage: true });
  await op.page.goto(`${node.url}/audit`);
  const saved = op.page.locator('table.audit tr[data-action="node_order.save"]').first();
  await saved.waitFor();
  assert.match(await saved.innerText(), /olivia\s+node-e2e\s+node_order\.save[\s\S]*order: node-e2e\s+saved \(revision \d+\)/);
  assert.deepEqual(op.problems, []);
  await op.context.close();

  const viewer = await livePage(VIEWER, '/settings/nodes');
  const vpanel = viewer.page.locator('section.priority-order');
  await vpanel.locator('li[data-node="node-e2e"]').waitFor();
  await vpanel.getByText('only operators may change the order').waitFor();
  await vpanel.locator('[data-order-set-by="olivia"]').waitFor();
  assert.equal(await vpanel.locator('button').count(), 0);
  assert.equal(await vpanel.locator('li[data-node="node-e2e"]').getAttribute('draggable'), 'false');
  // The handoffs panel is there, empty on a single node.
  await viewer.page.locator('section.handoffs').getByText('No handoff since this page opened.').waitFor();
  assert.deepEqual(viewer.problems, []);
  await viewer.context.close();
});

test('on a one-node fleet Move… is disabled and says why; a move asked anyway is refused with the reason and audited', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/seats');
  const move = page.locator('tr[data-seat="beta-agent"] button[data-action="move"]');
  await move.waitFor();
  assert.equal(await move.isDisabled(), true, 'nowhere to move it');
  assert.equal(await move.getAttribute('title'), 'no other node is live: a move needs a second node');
  assert.match(await move.getAttribute('aria-label'), /Move beta-agent: no other node is live/);
  await page.screenshot({ path: join(resultsDir, 'seats-move-disabled-1440.png') });
  const asked = await serverFn(page, 'move_seat', { handle: 'beta-agent', node: 'node-e2e', reason: 'checking the refusal' });
  assert.equal(asked.status, 400);
  assert.match(asked.body, /already runs on node/);
  await page.goto(`${node.url}/audit`);
  const audited = page.locator('table.audit tr[data-action="seat.move"]').first();
  await audited.waitFor();
  assert.match(await audited.innerText(), /olivia\s+node-e2e\s+seat\.move\s+beta-agent\s+checking the refusal\s+refused: seat "beta-agent" already runs on node "node-e2e"/);
  // The refusal itself is the one error the browser logs.
  assert.deepEqual(problems.filter((p) => !/status of 400/.test(p)), []);
  await context.close();
});

test("an operator approves a seat's waiting tool call from the Seats page, its long arguments shown whole: the call runs once, and the row shows the seat's tool server", async () => {
  const fsServer = process.env.CREWLET_MCP_FILESYSTEM;
  assert.ok(fsServer, 'CREWLET_MCP_FILESYSTEM names the filesystem server (./dev test installs it)');
  const work = realpathSync(mkdtempSync(join(tmpdir(), 'crewlet-e2e-fs-')));
  const target = join(work, 'approved.txt');
  const command = [process.execPath, fsServer, work].map((a) => JSON.stringify(a)).join(', ');
  const tooled = await startNode({
    id: 'node-e2e-tools',
    people: [OPERATOR, VIEWER],
    roles: [],
    more: `[[roles]]\nhandle = "writer-agent"\nagent = { kind = "echo", drills = true }\napprove = ["fs.write_file"]\nmcp = [{ name = "fs", command = [${command}] }]\n`,
  });
  try {
    const p = await strictPage(browser);
    const { page, context, problems } = p;
    await signIn(page, tooled.url, OPERATOR.name, OPERATOR.password);
    await page.goto(`${tooled.url}/seats`);
    await page.waitForSelector('html[data-hydrated]');
    await page.locator('.live.live-open').waitFor();
    const row = page.locator('tr[data-seat="writer-agent"]');
    await row.waitFor();
    const servers = row.locator('.tool-servers');
    await until('the row to show the running tool server', async () => /tools: fs running \(\d+\)/.test(await servers.innerText().catch(() => '')), 20000);
    // Long enough that a clipped card would hide `path` (keys are shown
    // sorted: `content` comes first).
    const content = `approved in the browser ${'lorem ipsum '.repeat(150)}END-OF-CONTENT`;
    const sent = await publish(page, 'writer-agent', {
      id: 'evt-e2e-approval',
      type: 'task_assigned',
      body: {
        tools: [{ name: 'fs.write_file', args: { path: target, content } }],
        echo: { rounds: 2 },
      },
    });
    assert.equal(sent.status, 200, sent.body);
    const waiting = page.locator('tr[data-approvals-for="writer-agent"] li[data-tool="fs.write_file"]');
    await waiting.waitFor({ timeout: 20000 });
    assert.match(await waiting.innerText(), /Waiting for approval: fs\.write_file/);
    const args = waiting.locator('pre.approval-args');
    const shown = await args.innerText();
    assert.ok(shown.includes(content), 'the whole content is shown, not a clipped part');
    assert.ok(shown.includes(target), 'and the path after it');
    assert.equal(await args.evaluate((el) => getComputedStyle(el).overflowY), 'auto', 'the arguments scroll');
    assert.equal(existsSync(target), false, 'nothing is written before a person approves');
    const approve = waiting.locator('button[data-action="approve"]');
    assert.equal(await approve.isDisabled(), true, 'a reason comes first');
    // A live refresh of the row may land between the typing and the click
    // and draw the row afresh (known: the typed reason is not kept across
    // it): type and approve again until the answer is shown.
    const answered = page.locator('p[data-answered]');
    let shot = false;
    await until('the approval answered', async () => {
      if ((await answered.count()) > 0) return true;
      await waiting.getByRole('textbox').fill('the report is due').catch(() => {});
      if (!shot && !(await approve.isDisabled().catch(() => true))) {
        await page.screenshot({ path: join(resultsDir, 'seats-approval-1280.png'), fullPage: true });
        shot = true;
      }
      await approve.click({ timeout: 1000 }).catch(() => {});
      return answered.waitFor({ timeout: 3000 }).then(() => true, () => false);
    }, 30000);
    assert.match(await page.locator('p[data-answered]').innerText(), /fs\.write_file approved \(writer-agent\)/);
    await until('the approved write', () => existsSync(target) && readFileSync(target, 'utf8') === content, 20000);
    await waiting.waitFor({ state: 'detached', timeout: 20000 });
    const audit = await serverFn(page, 'audit_log', {});
    assert.match(audit.body, /tool\.approve/);
    assert.match(audit.body, /the report is due/);
    assert.deepEqual(problems, []);
    await context.close();
  } finally {
    const code = await tooled.stop();
    assert.equal(code, 0, `the tooled node exits 0 on SIGTERM; its log:\n${tooled.log()}`);
  }
});

/**
 * The model provider's stand-in (a paid external service, scripted): an
 * OpenAI-compatible `POST /v1/chat/completions` that answers 503 while
 * `down` and a one-line completion once it is back.
 */
async function providerStandIn() {
  const { createServer: http } = await import('node:http');
  const state = { down: true, asked: 0 };
  const server = http((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      state.asked += 1;
      res.setHeader('content-type', 'application/json');
      if (state.down) {
        res.statusCode = 503;
        res.end(JSON.stringify({ error: { message: 'the provider is down', type: 'unavailable' } }));
        return;
      }
      res.end(JSON.stringify({
        id: 'chatcmpl-standin',
        object: 'chat.completion',
        created: 0,
        model: 'stand-in',
        choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'back and answering' } }],
        usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 },
      }));
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  state.url = `http://127.0.0.1:${server.address().port}/v1`;
  state.close = () => new Promise((r) => {
    server.closeAllConnections();
    server.close(r);
  });
  return state;
}

test('mail the queue gave up on while the model provider was down is a dead letter: counted in the menu and on Nodes, re-published once it is back and answered, a discard asks first, both audited', async () => {
  const provider = await providerStandIn();
  const dl = await startNode({
    id: 'node-e2e-dead',
    people: [OPERATOR, VIEWER],
    roles: [],
    more: `[stream]\nmax_deliveries = 2\nretry_delay_seconds = 0\n\n[[roles]]\nhandle = "model-agent"\nagent = { kind = "model", base_url = "${provider.url}", model = "stand-in" }\n`,
  });
  try {
    const { page, context, problems } = await strictPage(browser);
    await signIn(page, dl.url, OPERATOR.name, OPERATOR.password);
    await page.goto(`${dl.url}/seats`);
    await page.waitForSelector('html[data-hydrated]');
    await page.locator('tr[data-seat="model-agent"]').waitFor();
    for (const id of ['dl-1', 'dl-2']) {
      assert.equal((await publish(page, 'model-agent', { id, type: 'task_assigned', body: { text: `are you there (${id})` } })).status, 200);
    }
    await until('both dead-lettered', async () => {
      const r = await page.evaluate(async () => (await fetch('/api/dead-letters')).json());
      return r.total === 2;
    }, 30000);
    // Nodes raises the alarm and the menu counts them.
    await page.goto(`${dl.url}/settings/nodes`);
    await page.waitForSelector('html[data-hydrated]');
    const alarm = page.locator('li[data-alarm="dead_letters"]');
    await alarm.waitFor();
    assert.match(await alarm.innerText(), /2 dead letters kept/);
    assert.equal(await page.locator('nav [data-dead-letter-count]').innerText(), '2');
    await alarm.getByRole('link', { name: 'See the dead letters' }).click();
    await until('the Dead letters page', () => page.url().endsWith('/dead-letters'));
    await page.locator('.live.live-open').waitFor();
    const list = page.locator('ul.dead-letter-list');
    const oldest = list.locator('li.dead-letter').last();
    assert.match(await oldest.innerText(), /model-agent/);
    assert.match(await oldest.innerText(), /delivered \d+ times/);
    await oldest.locator('summary').click();
    assert.match(await oldest.locator('pre.dl-payload').innerText(), /are you there \(dl-1\)/);
    await page.screenshot({ path: join(resultsDir, 'dead-letters-1440.png'), fullPage: true });
    // The provider is back: the oldest is re-published and answered.
    provider.down = false;
    const oldestId = await oldest.getAttribute('data-dead-letter');
    await oldest.getByRole('button', { name: 'Re-publish' }).click();
    const done = page.locator(`[data-dead-letter-done="${oldestId}"]`);
    await done.waitFor();
    assert.match(await done.innerText(), /re-published to seat model-agent's inbox/);
    await list.locator(`li[data-dead-letter="${oldestId}"]`).waitFor({ state: 'detached' });
    await until('the re-published mail answered', async () => {
      const r = await page.evaluate(async () => (await fetch('/api/seats/model-agent/outbox')).json());
      return r.effects.some((e) => e.trigger_ids.includes('dl-1') && /back and answering/.test(e.text ?? ''));
    }, 30000);
    // A discard asks first; cancelling keeps it.
    const other = list.locator('li.dead-letter').first();
    const otherId = await other.getAttribute('data-dead-letter');
    await other.getByRole('button', { name: 'Discard…' }).click();
    await other.getByRole('button', { name: 'Cancel' }).click();
    await other.getByRole('button', { name: 'Discard…' }).click();
    await other.getByRole('button', { name: 'Discard', exact: true }).click();
    await page.locator(`[data-dead-letter-done="${otherId}"]`).waitFor();
    await page.getByText('No dead letters.').waitFor();
    // The seat's page says what it said once the provider was back.
    await page.goto(`${dl.url}/seats/model-agent`);
    await page.waitForSelector('html[data-hydrated]');
    await page.locator('ol.effects li.effect', { hasText: 'back and answering' }).waitFor();
    assert.match(await page.locator('.seat-dead-letters').innerText(), /No dead letters\./);
    const audit = await serverFn(page, 'audit_log', {});
    assert.match(audit.body, /dead_letter\.requeue/);
    assert.match(audit.body, /dead_letter\.discard/);
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(`${dl.url}/dead-letters`);
    await page.waitForSelector('html[data-hydrated]');
    await page.screenshot({ path: join(resultsDir, 'dead-letters-390.png'), fullPage: true });
    assert.deepEqual(problems, []);
    await context.close();
  } finally {
    await provider.close();
    const code = await dl.stop();
    assert.equal(code, 0, `the node exits 0 on SIGTERM; its log:\n${dl.log()}`);
  }
});

test('every page at 1440 and at 390 px: nothing scrolls sideways, and a screenshot of each is kept', async () => {
  const pages = [
    ['/settings/nodes', 'nodes'],
    ['/nodes/node-e2e', 'node'],
    ['/seats', 'seats'],
    ['/seats/alpha-agent', 'seat'],
    ['/memory?seat=alpha-agent', 'memory'],
    ['/events', 'events'],
    ['/dead-letters', 'dead-letters'],
    ['/audit', 'audit'],
    ['/settings/people', 'people'],
  ];
  const { page, context, problems } = await strictPage(browser, { width: 1440, height: 900 });
  await signIn(page, node.url, ADMIN.name, ADMIN.password);
  for (const width of [1440, 390]) {
    await page.setViewportSize({ width, height: width === 390 ? 844 : 900 });
    for (const [path, name] of pages) {
      await page.goto(`${node.url}${path}`);
      await page.waitForSelector('html[data-hydrated]');
      await page.locator('main h1').waitFor();
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `${path} scrolls sideways by ${overflow}px at ${width} px`);
      await page.screenshot({ path: join(resultsDir, `page-${name}-${width}.png`), fullPage: true });
    }
  }
  assert.deepEqual(problems, []);
  await context.close();
});
