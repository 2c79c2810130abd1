/**
 * A body refused while it is being read (413 past the limit, sent without a length to refuse
 * it by) must be answered and leave the console serving. The request-log line written when
 * the answer finishes reads `req.socket.remoteAddress`, and by then the request's socket is
 * gone: the listener throws outside any handler (in the console process: an uncaught
 * exception, the console exits).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';

const fixtures: ConsoleFixture[] = [];
after(async () => {
  for (const fx of fixtures) await fx.close();
});

/** POSTs `size` bytes chunked (two chunks, so only their sum crosses the limit); resolves with the status. */
function postChunked(url: string, token: string, size: number): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const req = http.request(url, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'transfer-encoding': 'chunked' } });
    req.on('response', (res) => {
      res.resume();
      resolve(res.statusCode!);
    });
    req.on('error', reject);
    req.write(' '.repeat(size - 1));
    req.end(' ');
  });
}

test('a usage body one byte over sync.maxUsageBytes, sent chunked: 413, and the console goes on serving', async () => {
  const fx = await startConsoleFixture({ overrides: { sync: { maxUsageBytes: 1000 } } as never });
  fixtures.push(fx);
  assert.equal(await postChunked(`${fx.url}/sync/v1/usage`, fx.tokens.sync, 1000), 200, 'at the limit');
  assert.equal(await postChunked(`${fx.url}/sync/v1/usage`, fx.tokens.sync, 1001), 413, 'over it');
  // Give the answer's 'finish' listeners their turn, then the console must still answer.
  await new Promise((r) => setImmediate(r));
  assert.equal((await fetch(`${fx.url}/healthz`)).status, 200);
});

test('an admin JSON body over 1 MiB, sent chunked: 413, and the console goes on serving', async () => {
  const fx = await startConsoleFixture();
  fixtures.push(fx);
  assert.equal(await postChunked(`${fx.url}/admin/v1/keys`, fx.tokens.admin, 1024 * 1024 + 1), 413);
  await new Promise((r) => setImmediate(r));
  assert.equal((await fetch(`${fx.url}/healthz`)).status, 200);
});
