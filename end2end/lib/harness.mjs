// Test harness: starts real `crewlet` nodes on free loopback ports with a
// temporary data dir, and a headless Chromium (Debian's package) to drive
// them. Everything started here is stopped by `stop()`.

import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, mkdirSync, existsSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const resultsDir = join(here, '..', 'test-results');
mkdirSync(resultsDir, { recursive: true });

export const crewletBin = process.env.CREWLET_BIN || join(here, '..', '..', 'target', 'debug', 'crewlet');

export function hashPassword(password) {
  return execFileSync(crewletBin, ['hash-password'], { input: password }).toString().trim();
}

/** Wait until `check()` returns a truthy value, or fail after `ms`. */
export async function until(what, check, ms = 15000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ''}`);
}

/**
 * Start a node. `people` is a list of {name, password, role}; `more` is
 * more company-file text (more roles, settings); `env` more environment
 * variables for the node (a fault injection).
 * Resolves to { url, proc, dir, log(), stop() } once the node answers /health.
 */
export async function startNode({ id = 'node-e2e', people = [], roles = ['alpha-agent', 'beta-agent'], more = '', nats = null, env = {} } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'crewlet-e2e-'));
  const users = people
    .map((p) => `[[auth.users]]\nname = "${p.name}"\npassword_hash = "${hashPassword(p.password)}"\nrole = "${p.role}"\n`)
    .join('\n');
  // A test node: the echo agent's drills (slow rounds, detached runs) are
  // what these tests steer turns with.
  const roleText = roles.map((h) => `[[roles]]\nhandle = "${h}"\nagent = { kind = "echo", drills = true }\n`).join('\n');
  const fleet = nats ? fleetConfig(nats) : '';
  const config = `[node]\nid = "${id}"\nlisten = "127.0.0.1:0"\ndata_dir = "${join(dir, 'data')}"\nlabels = ["e2e"]\nenvironment = "test"\n\n[runs]\nallow = ["/bin/sleep", "/bin/sh"]\n\n[company]\nname = "End-to-end company"\n\n${roleText}\n${fleet}\n${more}\n${users}\n[logging]\nformat = "json"\n`;
  const file = join(dir, 'crewlet.toml');
  writeFileSync(file, config);
  const proc = spawn(crewletBin, ['run', '--config', file], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let output = '';
  proc.stdout.on('data', (d) => (output += d));
  proc.stderr.on('data', (d) => (output += d));
  const exited = new Promise((r) => proc.on('exit', (code) => r(code)));
  const url = await until('the node to start', () => {
    if (proc.exitCode !== null) throw new Error(`node exited ${proc.exitCode}:\n${output}`);
    const m = output.match(/dashboard at (http:\/\/127\.0\.0\.1:\d+)\//);
    return m && m[1];
  });
  await until('/health to answer', async () => (await fetch(`${url}/health`)).ok);
  return {
    url,
    proc,
    dir,
    log: () => output,
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

/**
 * The company-file text that puts a node on a fleet sharing `nats` (from
 * `startNats`): leases in JetStream KV, mailboxes on JetStream, and the
 * shortest timings the company file allows, so a joining node takes its
 * share within a few seconds.
 */
function fleetConfig(nats) {
  return `[coordination]\ntype = "embedded-kv"\nlease_ttl_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n\n[stream]\ntype = "nats"\nurls = ["${nats.url}"]\n`;
}

/** A free loopback TCP port. */
export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * `NATS_SERVER` when set, else Debian's `nats-server`; null when that is
 * not installed.
 */
export function natsServerBin() {
  if (process.env.NATS_SERVER) return existsSync(process.env.NATS_SERVER) ? process.env.NATS_SERVER : null;
  return ['/usr/sbin/nats-server', '/usr/bin/nats-server', '/usr/local/bin/nats-server'].find((p) => existsSync(p)) || null;
}

/**
 * Start a JetStream `nats-server` on free loopback ports with a temporary
 * store directory. Resolves to { url, proc, log(), stop() } once JetStream
 * answers the monitor's health check; `stop()` kills it and removes the store.
 */
export async function startNats() {
  const bin = natsServerBin();
  if (!bin) throw new Error('nats-server is not installed (./dev deps installs it)');
  const dir = mkdtempSync(join(tmpdir(), 'crewlet-e2e-nats-'));
  const port = await freePort();
  const monitor = await freePort();
  const proc = spawn(bin, ['-js', '-sd', join(dir, 'jetstream'), '-a', '127.0.0.1', '-p', String(port), '-m', String(monitor)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  proc.stdout.on('data', (d) => (output += d));
  proc.stderr.on('data', (d) => (output += d));
  const exited = new Promise((r) => proc.on('exit', (code, signal) => r(code ?? signal)));
  await until('nats-server to answer with JetStream ready', async () => {
    if (proc.exitCode !== null) throw new Error(`nats-server exited ${proc.exitCode}:\n${output}`);
    return (await fetch(`http://127.0.0.1:${monitor}/healthz?js-enabled-only=true`)).ok;
  }, 30000);
  return {
    url: `nats://127.0.0.1:${port}`,
    proc,
    log: () => output,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-dev-shm-usage',
    ],
  });
}

/**
 * A new page that fails the test on any console error or warning (the
 * framework's own warnings included: data read outside a loading
 * boundary, say) or page error.
 */
export async function strictPage(browser, viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  const problems = [];
  page.on('console', (m) => (m.type() === 'error' || m.type() === 'warning') && problems.push(`console ${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  return { page, context, problems };
}

export async function signIn(page, url, name, password) {
  await page.goto(`${url}/settings/nodes`);
  await page.waitForURL(/\/login/);
  await page.fill('#name', name);
  await page.fill('#password', password);
  await Promise.all([page.waitForURL(/\/settings\/nodes/), page.click('button[type=submit]')]);
  await page.waitForSelector('html[data-hydrated]');
}
