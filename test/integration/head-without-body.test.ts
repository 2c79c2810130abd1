/**
 * DESIGN section 6: an upstream error, timeout or 5xx before any output releases a
 * request's hold. An upstream that sends its head and then no body byte before its timeout
 * produced no output: the client sees the head and a cut, nothing is billed, the hold and
 * the slot are given back. The same when the upstream's connection dies after its head.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream((req, res) => {
    // a head at once, then silence until the sidecar's timeout (or, asked, the connection dies)
    res.writeHead(200, { 'content-type': req.url === '/v1/chat/completions' ? 'application/json' : 'text/event-stream' });
    res.flushHeaders();
    if (req.headers['x-test'] === 'die') setImmediate(() => res.socket?.destroy());
  });
  h = await startHarness({
    upstream: up.url,
    config: { upstreams: { default: { url: up.url, timeoutMs: 200 } } },
    keys: { k_wallet: { concurrency: 1 } },
    records: [{ type: 'price', model: 'gpt-4o*', input: 1, output: 1, per: 1000 }],
  });
});
after(async () => {
  await h.close();
  await up.close();
});

/** access lines already read by an earlier case */
const seen = new Set<string>();

/** Sends a chat request on a raw socket and reads until the sidecar closes it. */
async function chat(path: string, extra = ''): Promise<string> {
  const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 500, messages: [{ role: 'user', content: 'hi' }] });
  const socket = net.connect(Number(new URL(h.url).port), '127.0.0.1');
  const got: Buffer[] = [];
  socket.on('data', (b: Buffer) => got.push(b));
  socket.write(`POST ${path} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_wallet}\r\nContent-Type: application/json\r\n${extra}Content-Length: ${body.length}\r\n\r\n${body}`);
  await once(socket, 'close');
  return Buffer.concat(got).toString('latin1');
}

for (const [path, how, extra] of [
  ['/v1/chat/completions', 'before the timeout', ''],
  ['/v1/responses', 'before the timeout', ''],
  ['/v1/chat/completions', 'before its connection dies', 'x-test: die\r\n'],
  ['/v1/responses', 'before its connection dies', 'x-test: die\r\n'],
] as const) {
  test(`${path}: a head and no body ${how} is not billed, and gives back what it held`, async () => {
    const line = waitForLine(h, (l) => l.msg === 'request' && l.path === path && l.req_id !== undefined && !seen.has(l.req_id as string));
    const answer = await chat(path, extra);
    seen.add((await line).req_id as string);
    assert.match(answer, /^HTTP\/1\.1 200 OK\r\n/, 'the head, then the cut');
    const logged = await line;
    assert.equal(logged.input_tokens, null, 'nothing settled');
    assert.equal(h.usage.filter((e) => e.key_id === 'k_wallet').length, 0, 'no usage event');
    const stats = h.sidecar.limiter.stats();
    assert.deepEqual([stats.holdsHeld, stats.slotsHeld], [0, 0], 'the hold and the concurrency slot given back');
  });
}
