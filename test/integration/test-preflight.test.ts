/**
 * scripts/test-preflight.mjs, which `npm test` runs the suite through: what a newcomer
 * without Redis or Chromium reads, and the private redis-server it starts when it can.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { REDIS_SERVER } from '../helpers/redis-server.js';

const SCRIPT = new URL('../../scripts/test-preflight.mjs', import.meta.url).pathname;

/** Runs the preflight with `env` added and `command` to run after it. */
function preflight(env: Record<string, string>, command: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [SCRIPT, ...command], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
}

/** A loopback port nothing listens on (it was free a moment ago). */
async function unusedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    socket.on('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.on('error', () => resolve(false));
  });
}

/** A command that leaves a file behind, so a test can tell whether it ran. */
function marker(): { command: string[]; ran: () => boolean; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), 'kw-preflight-'));
  const file = join(dir, 'ran');
  return {
    command: [process.execPath, '-e', `require('node:fs').writeFileSync(${JSON.stringify(file)}, 'x')`],
    ran: () => existsSync(file),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

test('without Redis and without redis-server: one line says how to get it, exit 1, the tests do not run', async () => {
  const port = await unusedPort();
  const m = marker();
  try {
    const r = await preflight({ KW_TEST_REDIS_URL: `redis://127.0.0.1:${port}`, REDIS_SERVER: '/nonexistent/redis-server', KEYWARD_CHROMIUM: process.execPath }, m.command);
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    const lines = r.stderr.split('\n').filter(Boolean);
    assert.equal(lines.length, 1, r.stderr);
    assert.match(lines[0]!, new RegExp(`^test preflight: no Redis answers at redis://127\\.0\\.0\\.1:${port} \\(KW_TEST_REDIS_URL\\), and there is no redis-server to start one`));
    assert.match(lines[0]!, /apt-get install redis-server, or set KW_TEST_REDIS_URL to a Redis that answers$/);
    assert.equal(m.ran(), false);
  } finally {
    m.remove();
  }
});

test('without Chromium: one line says the console page tests will be skipped and how to install it; the tests run', async () => {
  const m = marker();
  try {
    const r = await preflight({ KW_TEST_REDIS_URL: TEST_REDIS_URL, KEYWARD_CHROMIUM: '/nonexistent/chromium' }, m.command);
    assert.equal(r.code, 0);
    assert.deepEqual(r.stderr.split('\n').filter(Boolean), [
      'test preflight: no Chromium at /nonexistent/chromium: the console page tests will be skipped (apt-get install chromium, or set KEYWARD_CHROMIUM)',
    ]);
    assert.equal(m.ran(), true);
  } finally {
    m.remove();
  }
});

test("the command's exit code is the preflight's", async () => {
  const r = await preflight({ KW_TEST_REDIS_URL: TEST_REDIS_URL, KEYWARD_CHROMIUM: process.execPath }, [process.execPath, '-e', 'process.exit(7)']);
  assert.equal(r.code, 7);
  assert.equal(r.stderr, '');
});

test('nothing listening on a loopback port: a private redis-server answers there for the run and is gone after', { skip: existsSync(REDIS_SERVER) ? false : `no redis-server at ${REDIS_SERVER}` }, async () => {
  const port = await unusedPort();
  // The command asks the server for PONG itself and fails without it.
  const ping = `const s = require('node:net').connect(${port}, '127.0.0.1', () => s.write('PING\\r\\n'));` +
    `s.on('data', (b) => process.exit(b.toString() === '+PONG\\r\\n' ? 0 : 3)); s.on('error', () => process.exit(4));`;
  const r = await preflight({ KW_TEST_REDIS_URL: `redis://127.0.0.1:${port}`, REDIS_SERVER, KEYWARD_CHROMIUM: process.execPath }, [process.execPath, '-e', ping]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stderr, new RegExp(`^test preflight: started a private redis-server on redis://127\\.0\\.0\\.1:${port} for this run`));
  assert.equal(await listening(port), false, 'the private redis-server is stopped when the command ends');
});

test('a run past KW_TEST_DEADLINE_S is stopped with what it started, exit 1, one line says why', { timeout: 30_000 }, async () => {
  // The command starts a process that listens and never ends, then hangs itself.
  const listener = `const s = require('node:net').createServer().listen(0, '127.0.0.1', () => process.stdout.write(s.address().port + '\\n'));`;
  const hang = `require('node:child_process').spawn(process.execPath, ['-e', ${JSON.stringify(listener)}], { stdio: ['ignore', 'inherit', 'inherit'] }); setInterval(() => {}, 1000);`;
  const r = await preflight({ KW_TEST_REDIS_URL: TEST_REDIS_URL, KEYWARD_CHROMIUM: process.execPath, KW_TEST_DEADLINE_S: '3' }, [process.execPath, '-e', hang]);
  assert.equal(r.code, 1);
  assert.deepEqual(r.stderr.split('\n').filter(Boolean), [
    'test preflight: the run did not finish within 3 s (KW_TEST_DEADLINE_S): stopping it and every process it started',
  ]);
  const port = Number(r.stdout.trim());
  assert.ok(port > 0, `the listener's port (${r.stdout})`);
  assert.equal(await listening(port), false, 'the process the command started is gone too');
});
