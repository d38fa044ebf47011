// The signed-in dashboard, driven in headless Chromium against a real node:
// sign-in, hydration, the Nodes page, people and the audit log, the Seats
// page's pause / resume / stop, the Events page and live updates from the
// node's event stream.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { startNode, launchBrowser, strictPage, signIn, resultsDir, until } from '../lib/harness.mjs';

const OPERATOR = { name: 'olivia', password: 'operator-pass-1', role: 'operator' };
const VIEWER = { name: 'victor', password: 'viewer-pass-1', role: 'viewer' };

let node;
let browser;

before(async () => {
  node = await startNode({ people: [OPERATOR, VIEWER] });
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
  assert.match(seat, /epoch 1 · since \d\d:\d\d/);
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

test('a viewer sees adding a person disabled and is refused anyway; an operator adds one; both are audited', async () => {
  const viewer = await strictPage(browser);
  await signIn(viewer.page, node.url, VIEWER.name, VIEWER.password);
  await viewer.page.goto(`${node.url}/settings/people`);
  await viewer.page.waitForSelector('html[data-hydrated]');
  await viewer.page.getByText('Only operators may add people.').waitFor();
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
  assert.match(refused.body, /victor is a viewer: only operators may add people\./);
  await viewer.context.close();

  const op = await strictPage(browser);
  await signIn(op.page, node.url, OPERATOR.name, OPERATOR.password);
  await op.page.goto(`${node.url}/settings/people`);
  await op.page.waitForSelector('html[data-hydrated]');
  await op.page.fill('#new-name', 'alice');
  await op.page.selectOption('#new-role', 'viewer');
  await op.page.click('form.inline-form button[type=submit]');
  const shown = await op.page.locator('[role=status] code').innerText();
  assert.equal(shown.length, 20, 'the generated password is shown once');
  const audit = op.page.locator('table.audit tbody');
  await audit.getByText('alice as viewer').waitFor();
  const text = await audit.innerText();
  assert.match(text, /victor\s+add_person\s+mallory as viewer\s+refused: not an operator/);
  assert.match(text, /olivia\s+add_person[\s\S]*alice as viewer\s+ok/);
  await op.page.screenshot({ path: join(resultsDir, 'people-1280.png'), fullPage: true });
  await op.context.close();

  // The new person can sign in with the password shown.
  const alice = await strictPage(browser);
  await signIn(alice.page, node.url, 'alice', shown);
  assert.match(await alice.page.locator('.person').innerText(), /alice/);
  await alice.context.close();
});

test('the Nodes page is readable at 390 px wide', async () => {
  const { page, context, problems } = await strictPage(browser, { width: 390, height: 844 });
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  await page.locator('tr[data-node="node-e2e"]').waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px at 390 px`);
  await page.screenshot({ path: join(resultsDir, 'nodes-390.png'), fullPage: true });
  assert.deepEqual(problems, []);
  await context.close();
});

test('signing out ends the session', async () => {
  const { page, context } = await strictPage(browser);
  await signIn(page, node.url, VIEWER.name, VIEWER.password);
  await Promise.all([page.waitForURL(/\/login$/), page.click('form.signout button')]);
  await page.goto(`${node.url}/settings/nodes`);
  await page.waitForURL(/\/login\?next=/);
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
  assert.match(await row(op.page).innerText(), /node-e2e[\s\S]*since \d\d:\d\d · epoch 1/);
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
  assert.match(paused, /paused by olivia · \d\d:\d\d · rotating the e2e keys · turn stopped/);
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
  assert.match(await pauseRow.innerText(), /olivia\s+seat\.pause\s+alpha-agent\s+rotating the e2e keys\s+paused; the running turn stops at its next round/);
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
  assert.match(await audit.page.locator('table.audit tr[data-action="seat.resume"]').first().innerText(), /olivia\s+seat\.resume\s+alpha-agent\s+resumed/);
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
  assert.equal(await buttons.count(), 2);
  for (let i = 0; i < 2; i++) assert.equal(await buttons.nth(i).isDisabled(), true);
  await page.getByText('only operators may pause, resume or stop seats').waitFor();
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

  // Filter by type, seat and node in the page.
  await page.selectOption('#event-type', 'seat_resumed');
  await pausedRow.waitFor({ state: 'detached' });
  await page.selectOption('#event-type', 'seat_paused');
  await pausedRow.waitFor();
  await page.fill('#event-seat', 'alpha');
  await pausedRow.waitFor({ state: 'detached' });
  await page.fill('#event-seat', 'beta');
  await pausedRow.waitFor();
  await page.fill('#event-node', 'some-other-node');
  await pausedRow.waitFor({ state: 'detached' });
  await page.fill('#event-node', '');
  await page.selectOption('#event-type', '');

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
  await page.fill('#event-seat', 'beta-agent');
  await page.screenshot({ path: join(resultsDir, 'events-1280.png'), fullPage: true });
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
  await page.locator('tr[data-seat="alpha-agent"] button[data-action="stop"]').click();
  const dialog = page.locator('dialog.confirm[open]');
  await dialog.waitFor();
  assert.match(await dialog.innerText(), /Stop alpha-agent's running turn\?[\s\S]*node-e2e holds it/);
  await page.screenshot({ path: join(resultsDir, 'seats-confirm-390.png') });
  await dialog.getByRole('button', { name: 'Stop turn', exact: true }).click();
  await page.getByText('alpha-agent: stop requested').waitFor();
  assert.deepEqual(problems, []);
  await context.close();
});

test('the Nodes page shows a new seat without a reload when a company adds one', async () => {
  const { page, context, problems } = await livePage(OPERATOR, '/settings/nodes');
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
  assert.match(await row.locator('li[data-seat="gamma-agent"]').innerText(), /epoch 1 · since \d\d:\d\d/);
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
