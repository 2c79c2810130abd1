/**
 * Connections keyward has done with close within a bound, whatever the client does: one
 * answered on the raw socket (a CONNECT; a request the parser refused is ended the same
 * way, framing.ts) that the client keeps half open, and one whose denied request's small body trickles in a byte at a time.
 * Each client goes on writing a byte now and then, as a client that holds a connection
 * would; the sidecar's close shows as a reset on the next write.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { LINGER_MS } from '../../src/proxy/upstream/framing.js';
import { DISCARD_MS } from '../../src/proxy/denial.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

let up: FakeUpstream;
let h: Harness;
before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k: {} } });
});
after(async () => {
  await h.close();
  await up.close();
});

/**
 * Sends `head`, then a byte every 200 ms for as long as the connection lasts; resolves with
 * what came back and when the sidecar dropped the connection, or rejects at `deadlineMs`.
 */
function holdOpen(head: string, deadlineMs: number): Promise<{ answer: string; droppedAfterMs: number }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ port: new URL(h.url).port as unknown as number, host: '127.0.0.1', allowHalfOpen: true });
    let answer = '';
    const started = performance.now();
    socket.on('data', (c: Buffer) => (answer += c.toString('latin1')));
    socket.on('error', () => {}); // the reset the drop shows as
    const ticker = setInterval(() => socket.write('x'), 200);
    const deadline = setTimeout(() => {
      clearInterval(ticker);
      socket.destroy();
      reject(new Error(`still open after ${deadlineMs} ms; got ${JSON.stringify(answer.slice(0, 80))}`));
    }, deadlineMs);
    socket.once('close', () => {
      clearInterval(ticker);
      clearTimeout(deadline);
      resolve({ answer, droppedAfterMs: performance.now() - started });
    });
    socket.write(head);
  });
}

test('a CONNECT answered 400 is dropped once the client keeps its half open past the linger time', async () => {
  const r = await holdOpen('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n', LINGER_MS + 5_000);
  assert.match(r.answer, /^HTTP\/1\.1 400 /);
  assert.ok(r.droppedAfterMs >= LINGER_MS - 100, `dropped after ${r.droppedAfterMs} ms`);
});

test("a denied request's small body that trickles in is dropped after the discard time", async () => {
  // No key: 401 at once, with the 1 KiB body still to come, a byte every 200 ms.
  const r = await holdOpen('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1024\r\n\r\n', DISCARD_MS + 5_000);
  assert.match(r.answer, /^HTTP\/1\.1 401 /);
  assert.ok(r.droppedAfterMs >= DISCARD_MS - 100, `dropped after ${r.droppedAfterMs} ms`);
});
