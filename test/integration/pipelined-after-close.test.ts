/**
 * A request pipelined behind an answer that closes the connection (an HTTP/1.0 client's,
 * a denial that leaves an unsized body unread, one in flight when a drain starts) can never
 * be answered: it is not forwarded and not billed, and its access line says 499. Every
 * answer to an HTTP/1.0 client says so, keyward's own `/v1/key` answer included.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { rmSync } from 'node:fs';
import { echoJson, startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { connect } from 'node:net';
import { accessLines, startBehindUpstream, startHarness, type Harness } from '../helpers/sidecar.js';
import { rawExchange } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;
let port: number;

before(async () => {
  ({ up, h, close } = await startBehindUpstream({ keys: { k_ok: {} } }));
  port = Number(new URL(h.url).port);
});
after(() => close());

const BODY = '{"model":"gpt-4o","messages":[]}';
const chat = (version: string, extra = '') =>
  `POST /v1/chat/completions HTTP/${version}\r\nHost: x\r\n${extra}Authorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${BODY.length}\r\n\r\n${BODY}`;

const firsts: { name: string; head: () => string; status: number; forwarded: number }[] = [
  { name: 'an HTTP/1.0 keep-alive request, answered close', head: () => chat('1.0', 'Connection: keep-alive\r\n'), status: 200, forwarded: 1 },
  { name: 'a 404 leaving a chunked body unread', head: () => 'POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n', status: 404, forwarded: 0 },
  { name: 'a 400 invalid_path leaving a chunked body unread', head: () => 'POST /v1/../x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n', status: 400, forwarded: 0 },
];

/** The access lines from index `from` on, once there are `n` of them. */
async function accessLinesFrom(from: number, n: number): Promise<Record<string, unknown>[]> {
  while (accessLines(h).length < from + n) await once(h.logEvents, 'line');
  return accessLines(h).slice(from, from + n);
}

for (const first of firsts) {
  test(`behind ${first.name}: not forwarded, not billed, logged 499`, async () => {
    for (let round = 0; round < 3; round++) {
      const received = up.received.length;
      const lines = accessLines(h).length;
      const usage = h.usage.length;
      const ex = await rawExchange(port, [first.head() + chat('1.1')]);
      assert.deepEqual(ex.responses.map((r) => r.status), [first.status]);
      assert.ok(ex.closed);
      const logged = await accessLinesFrom(lines, 2);
      assert.deepEqual(logged.map((l) => [l.path, l.status]).sort(), [[first.head().split(' ')[1], first.status], ['/v1/chat/completions', 499]].sort());
      // a whole round trip after: anything forwarded by mistake has reached the upstream by then
      const check = await rawExchange(port, [chat('1.1', 'Connection: close\r\n')]);
      assert.deepEqual(check.responses.map((r) => r.status), [200]);
      await accessLinesFrom(lines, 3); // the check's own, with its usage event
      assert.equal(up.received.length - received, first.forwarded + 1, `round ${round}: forwarded`);
      const events = h.usage.slice(usage);
      assert.deepEqual(events.map((e) => e.status), [...Array(first.forwarded).fill(200), 200], `round ${round}: billed`);
    }
  });
}

test('every answer to an HTTP/1.0 client closes the connection, keyward\'s own /v1/key answer included', async () => {
  const ex = await rawExchange(port, [`GET /v1/key HTTP/1.0\r\nConnection: keep-alive\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\n`]);
  assert.deepEqual(ex.responses.map((r) => [r.status, r.headers.connection]), [[200, 'close']]);
  assert.ok(ex.closed);
  const denied = await rawExchange(port, ['GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\nAuthorization: Bearer not-a-key\r\n\r\n']);
  assert.deepEqual(denied.responses.map((r) => [r.status, r.headers.connection]), [[401, 'close']]);
  assert.ok(denied.closed);
});

test('behind a request in flight when the drain starts: not forwarded, not billed, logged 499', async () => {
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const slow = await startFakeUpstream(async (req, res, rec) => {
    await held;
    void echoJson(req, res, rec);
  });
  const drained = await startHarness({ upstream: slow.url, keys: { k_ok: {} } });
  try {
    const socket = connect(Number(new URL(drained.url).port), '127.0.0.1');
    const bytes: Buffer[] = [];
    socket.on('data', (c: Buffer) => bytes.push(c));
    const ended = once(socket, 'close');
    const request = (id: string) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-request-id: ${id}\r\nAuthorization: Bearer ${drained.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${BODY.length}\r\n\r\n${BODY}`;
    const arrived = once(slow.arrivals, 'head');
    socket.write(request('first'));
    await arrived;
    const closing = drained.sidecar.close({ graceMs: 5_000 });
    const lines = accessLines(drained).length;
    socket.write(request('second'));
    while (!accessLines(drained).slice(lines).some((l) => l.req_id === 'second')) await once(drained.logEvents, 'line');
    release();
    await closing;
    await ended;
    assert.deepEqual(accessLines(drained).map((l) => [l.req_id, l.status]), [['second', 499], ['first', 200]]);
    assert.equal(slow.received.length, 1, 'only the first reached the upstream');
    assert.deepEqual(drained.usage.map((e) => [e.request_id, e.status]), [['first', 200]]);
    assert.match(Buffer.concat(bytes).toString('latin1'), /^HTTP\/1\.1 200 [^]*connection: close/i);
  } finally {
    release();
    await slow.close();
    await drained.replica.close();
    rmSync(drained.dir, { recursive: true, force: true });
  }
});

test('an upgrade request (curl --http2\'s h2c) is answered with close: Node drops what follows it, which would otherwise hang', async () => {
  const received = up.received.length;
  const upgrade = `GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n`;
  const ex = await rawExchange(port, [upgrade + chat('1.1')]);
  assert.deepEqual(ex.responses.map((r) => [r.status, r.headers.connection]), [[200, 'close']]);
  assert.ok(ex.closed, 'the connection ends: the client sends its next request again');
  assert.equal(up.received.length - received, 1, 'only the first reached the upstream');
});
