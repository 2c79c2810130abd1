/**
 * The console's port under clients that never finish a request: a refusal before the body
 * was read ends its connection (the body's rest is read and thrown away for a short while,
 * so the answer is not lost to a reset), and no connection outlives that.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { LINGER_MS } from '../../src/console/server.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';

let fx: ConsoleFixture;
before(async () => {
  fx = await startConsoleFixture();
});
after(async () => {
  await fx.close();
});

test('a request without a token that announces a huge body and trickles it: 401 with connection close, then the connection ends', { timeout: 15_000 }, async () => {
  const u = new URL(fx.url);
  const socket = net.connect(Number(u.port), u.hostname);
  await once(socket, 'connect');
  let answer = '';
  socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
  const closed = once(socket, 'close');
  socket.write(`POST /admin/v1/keys HTTP/1.1\r\nhost: console\r\ncontent-type: application/json\r\ncontent-length: 1000000000\r\n\r\n{`);
  const trickle = setInterval(() => socket.writable && socket.write('x'), 100);
  const started = performance.now();
  try {
    await closed;
  } finally {
    clearInterval(trickle);
  }
  const took = performance.now() - started;
  assert.match(answer, /^HTTP\/1\.1 401 /);
  assert.match(answer, /\r\nconnection: close\r\n/i);
  assert.match(answer, /"code":"unauthorized"/);
  assert.ok(took < LINGER_MS + 3_000, `the connection ended ${took.toFixed(0)} ms after the request`);
});
