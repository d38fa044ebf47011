// The signed-in dashboard shell, driven in headless Chromium against a real
// node: sign-in, hydration, the Nodes page, people and the audit log.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { startNode, launchBrowser, strictPage, signIn, resultsDir } from '../lib/harness.mjs';

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
