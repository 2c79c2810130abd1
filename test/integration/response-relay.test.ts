/**
 * The upstream's response reaches the client as it was sent, less what belongs to the
 * upstream's own connection: status line and reason, every header line (repeated ones
 * such as Set-Cookie included), hop-by-hop headers and those the upstream's Connection
 * names dropped, the client's own keep-alive, and a body larger than the socket buffers
 * relayed whole to a client that reads slowly. An upstream that dies mid-body leaves the
 * client a visibly broken response, never one that looks whole.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { createHash, randomBytes } from 'node:crypto';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { rawExchange } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;
let release!: () => void;
const releaseBody = new Promise<void>((r) => (release = r));
const BIG = randomBytes(8 << 20);

before(async () => {
  up = await startFakeUpstream((req, res) => {
    if (req.url === '/v1/models/thinking') {
      // The head at once, the body only when the test has seen the head reach the client.
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
      return void releaseBody.then(() => res.end('data: {"ok":true}\n\n'));
    }
    if (req.url === '/v1/models/noreason') return void res.writeHead(200, '', ['X-Mixed-Case', 'yes']).end('{}');
    if (req.url === '/v1/models/withid') return void res.writeHead(200, '', ['X-Request-Id', 'upstream-req-7']).end('{}');
    // a Keep-Alive line that no Connection line lists: hop-by-hop by its name alone
    if (req.url === '/v1/models/keepalive') return void res.writeHead(200, '', ['Connection', 'close', 'Keep-Alive', 'timeout=1, max=1']).end('{}');
    if (req.url === '/v1/chat/completions') {
      // one event, then the connection dies before the final chunk
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      return void res.write('data: {"choices":[{"delta":{"content":"hello"}}]}\n\n', () => res.socket?.destroy());
    }
    if (req.url === '/v1/models/big') {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': BIG.length });
      return void res.end(BIG);
    }
    res.writeHead(203, 'Fine By Me', [
      'Content-Type', 'application/json',
      'Set-Cookie', 'a=1; Path=/',
      'Set-Cookie', 'b=2; Path=/',
      'Connection', 'keep-alive, X-Upstream-Private',
      'X-Upstream-Private', 'secret',
      'Keep-Alive', 'timeout=5',
      'X-Upstream', 'kept',
      'X-Repeated', 'one',
      'X-Repeated', 'two',
      'x-ratelimit-limit-requests', '999999',
      'X-Keyward-Error', 'invalid_api_key',
      'Transfer-Encoding', 'chunked',
    ]);
    res.end('{"object":"list","data":[]}');
  });
  h = await startHarness({ upstream: up.url, keys: { k_ok: {}, k_limited: { rpm: 10 } } });
});
after(async () => {
  await h.close();
  await up.close();
});

const request = (key: string, path: string, version = '1.1') => `GET ${path} HTTP/${version}\r\nhost: x\r\nauthorization: Bearer ${key}\r\n\r\n`;

/** The header lines of the first response, as sent. */
const headLines = (bytes: Buffer) => bytes.toString('latin1', 0, bytes.indexOf('\r\n\r\n')).split('\r\n');

describe('response relay', () => {
  test('a head the upstream sends before its body reaches the client before the body does', async () => {
    const socket = net.connect(Number(new URL(h.url).port), '127.0.0.1');
    const got: Buffer[] = [];
    socket.on('data', (b: Buffer) => got.push(b));
    socket.write(request(h.keys.k_ok!, '/v1/models/thinking'));
    // The upstream holds its body until the head has arrived: a head held back for the body never would.
    while (!Buffer.concat(got).includes('\r\n\r\n')) await once(socket, 'data');
    const head = Buffer.concat(got).toString('latin1');
    assert.match(head, /^HTTP\/1\.1 200 OK\r\n/);
    assert.ok(!head.includes('data:'), 'the body has not been sent yet');
    release();
    while (!Buffer.concat(got).includes('data: {"ok":true}')) await once(socket, 'data');
    socket.destroy();
  });

  test('status line, reason and every header line as the upstream sent them, less its own connection', async () => {
    const ex = await rawExchange(h.sidecar.port, [request(h.keys.k_limited!, '/v1/models')], { expect: 1 });
    const lines = headLines(ex.bytes);
    assert.equal(lines[0], 'HTTP/1.1 203 Fine By Me');
    const named = (n: string) => lines.filter((l) => l.toLowerCase().startsWith(`${n}:`)).map((l) => l.slice(n.length + 1).trim());
    assert.deepEqual(named('set-cookie'), ['a=1; Path=/', 'b=2; Path=/'], 'repeated lines stay apart');
    assert.deepEqual(named('x-upstream'), ['kept']);
    // as the raw lines came, not joined into one as Node's header object would have them
    assert.deepEqual(named('x-repeated'), ['one', 'two']);
    assert.deepEqual(named('x-upstream-private'), [], 'named by the upstream\'s Connection');
    assert.deepEqual(named('keep-alive'), []);
    assert.deepEqual(named('connection'), ['keep-alive'], 'the client\'s own connection');
    // the upstream's figures describe its provider account, never this key: the key's own replace them
    assert.deepEqual(named('x-ratelimit-limit-requests'), ['10']);
    assert.equal(named('x-request-id').length, 1);
    // only keyward's own denials carry it: a client tells them from the upstream's answers by it
    assert.deepEqual(named('x-keyward-error'), []);
    assert.deepEqual(named('transfer-encoding'), ['chunked'], 'framed by the sidecar for its own connection');
    assert.equal(ex.responses[0]!.body.toString(), '{"object":"list","data":[]}');
    // names as the upstream wrote them
    assert.deepEqual(lines.filter((l) => /^set-cookie:|^x-upstream:/i.test(l)).map((l) => l.slice(0, l.indexOf(':'))), ['Set-Cookie', 'Set-Cookie', 'X-Upstream']);
  });

  test('an empty reason stays empty, not the one Node would put there', async () => {
    const ex = await rawExchange(h.sidecar.port, [request(h.keys.k_ok!, '/v1/models/noreason')], { expect: 1 });
    const lines = headLines(ex.bytes);
    assert.equal(lines[0], 'HTTP/1.1 200 ');
    assert.ok(lines.includes('X-Mixed-Case: yes'), lines.join('\n'));
  });

  test("the upstream's own x-request-id is the one the client gets: no second line", async () => {
    const ex = await rawExchange(h.sidecar.port, [request(h.keys.k_ok!, '/v1/models/withid')], { expect: 1 });
    const ids = headLines(ex.bytes).filter((l) => /^x-request-id:/i.test(l));
    assert.deepEqual(ids, ['X-Request-Id: upstream-req-7']);
  });

  test("the upstream's Keep-Alive line is not relayed when no Connection line lists it", async () => {
    const ex = await rawExchange(h.sidecar.port, [request(h.keys.k_ok!, '/v1/models/keepalive')], { expect: 1 });
    const lines = headLines(ex.bytes);
    assert.match(lines[0]!, /^HTTP\/1\.1 200 /);
    assert.deepEqual(lines.filter((l) => /^keep-alive:/i.test(l)), [], lines.join(' | '));
  });

  test('an upstream that dies mid-body cuts the client connection: no final chunk, no open stream', { timeout: 10_000 }, async () => {
    const body = JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] });
    const line = waitForLine(h, (l) => l.path === '/v1/chat/completions');
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    // resolves once the sidecar closes the connection; a stream left open times out and fails
    const ex = await rawExchange(h.sidecar.port, [head + body], { timeoutMs: 3000 });
    const text = ex.bytes.toString('latin1');
    assert.match(text, /^HTTP\/1\.1 200 /);
    assert.ok(text.includes('"content":"hello"'), 'the event sent before the cut was relayed');
    assert.ok(!text.endsWith('0\r\n\r\n'), 'no final chunk: the client can tell the response broke');
    assert.equal((await line).usage_estimated, true, 'billed at the estimate: the stream reported no usage');
  });

  test('an HTTP/1.0 client is answered close, its body delimited by the close', async () => {
    const ex = await rawExchange(h.sidecar.port, [request(h.keys.k_ok!, '/v1/models', '1.0')]);
    const lines = headLines(ex.bytes);
    assert.ok(lines.includes('connection: close'), lines.join(' | '));
    assert.ok(!lines.some((l) => l.toLowerCase().startsWith('transfer-encoding')), 'no chunked framing for 1.0');
    assert.ok(ex.bytes.toString('latin1').endsWith('{"object":"list","data":[]}'));
    assert.ok(ex.closed);
  });

  test('a body larger than the socket buffers reaches a client that reads slowly, whole', async () => {
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    socket.write(request(h.keys.k_ok!, '/v1/models/big'));
    const chunks: Buffer[] = [];
    let got = 0;
    let paused = 0;
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      got += c.length;
      // read in bursts: the sidecar's writes back up, and its relay must wait and resume
      if (paused < 20 && got > (paused + 1) * 256 * 1024) {
        paused++;
        socket.pause();
        setImmediate(() => socket.resume());
      }
    });
    const whole = () => {
      const buf = Buffer.concat(chunks);
      const at = buf.indexOf('\r\n\r\n');
      return at !== -1 && buf.length - at - 4 >= BIG.length ? buf.subarray(at + 4) : null;
    };
    while (whole() === null) await once(socket, 'data');
    socket.destroy();
    assert.ok(paused > 0, 'the client paused');
    assert.equal(createHash('sha256').update(whole()!).digest('hex'), createHash('sha256').update(BIG).digest('hex'));
  });
});
