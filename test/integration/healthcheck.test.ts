/**
 * The image's HEALTHCHECK (bin/healthcheck.mjs) for both verbs the image runs: healthy when
 * the sidecar's admin /healthz or the console's answers 200, unhealthy when neither does.
 * Real servers on port 0 stand in for the two listeners.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const SCRIPT = fileURLToPath(new URL('../../bin/healthcheck.mjs', import.meta.url));

async function server(status: number): Promise<{ port: number; close(): void }> {
  const s = http.createServer((req, res) => {
    res.writeHead(req.url === '/healthz' ? status : 404);
    res.end();
  });
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  return { port: (s.address() as { port: number }).port, close: () => s.close() };
}

/** Runs the check in a child process (async: the servers above answer from this one). */
async function check(env: Record<string, string>): Promise<number> {
  const child = spawn(process.execPath, [SCRIPT], { env: { ...process.env, KEYWARD_HEALTH_URL: '', ...env }, stdio: 'ignore' });
  const [code] = (await once(child, 'exit')) as [number];
  return code;
}

test('healthy when the admin /healthz or the console /healthz answers 200, else not', async () => {
  const ok = await server(200);
  const down = await server(503);
  try {
    const both = (admin: number, consolePort: number) => check({ KEYWARD_ADMIN_PORT: String(admin), KEYWARD_CONSOLE_PORT: String(consolePort) });
    assert.equal(await both(ok.port, down.port), 0, 'the sidecar');
    assert.equal(await both(down.port, ok.port), 0, 'the console, from the same image');
    assert.equal(await both(down.port, down.port), 1, 'neither');
    assert.equal(await check({ KEYWARD_HEALTH_URL: `http://127.0.0.1:${ok.port}/healthz` }), 0);
    assert.equal(await check({ KEYWARD_HEALTH_URL: `http://127.0.0.1:${down.port}/healthz` }), 1);
  } finally {
    ok.close();
    down.close();
  }
});
