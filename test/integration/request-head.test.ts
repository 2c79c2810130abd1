/**
 * What is refused before the decision, on raw sockets through a sidecar to a recording
 * upstream: Host lines other than exactly one, an expectation other than 100-continue, a
 * CONNECT, a request line the parser refuses. Each answer carries keyward's JSON body in
 * the route's style, takes nothing from the key's limits, bills nothing, reaches nothing,
 * and is counted and logged like any other request (DESIGN sections 3, 5 and 9).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { echoJson, startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { rawExchange, type ParsedResponse } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_ok: {}, k_rpm: { rpm: 5 } } });
});
after(async () => {
  await h.close();
  await up.close();
});

const CHAT = '{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}';

function errorOf(res: ParsedResponse): { code: string; style: 'openai' | 'messages'; message: string } {
  const body = JSON.parse(res.body.toString()) as { type?: string; error: { code?: string; type: string; message: string } };
  assert.equal(res.headers['content-type'], 'application/json');
  assert.equal(Number(res.headers['content-length']), res.body.length);
  const code = res.headers['x-keyward-error'] as string;
  if (body.type === 'error') return { code, style: 'messages', message: body.error.message };
  assert.equal(body.error.code, code);
  return { code, style: 'openai', message: body.error.message };
}

async function metric(series: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${h.sidecar.adminPort}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? 0 : Number(line.slice(series.length + 1));
}

async function remainingRequests(key: string): Promise<number> {
  const res = await fetch(`${h.url}/v1/key`, { headers: { authorization: `Bearer ${key}` } });
  return ((await res.json()) as { remaining: { requests: number } }).remaining.requests;
}

describe('Host lines', () => {
  for (const [name, hosts] of [['the same twice', ['kw', 'kw']], ['two different', ['kw', 'elsewhere.example']]] as const) {
    test(`two Host lines (${name}) are 400 invalid_request before any limit: nothing forwarded, taken or billed`, async () => {
      const forwarded = up.received.length;
      const usage = h.usage.length;
      const left = await remainingRequests(h.keys.k_rpm!);
      const head = `POST /v1/chat/completions HTTP/1.1\r\n${hosts.map((v) => `Host: ${v}\r\n`).join('')}Authorization: Bearer ${h.keys.k_rpm}\r\nContent-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n\r\n${CHAT}`;
      const ex = await rawExchange(h.sidecar.port, [head], { expect: 1 });
      assert.equal(ex.responses[0]!.status, 400);
      const err = errorOf(ex.responses[0]!);
      assert.equal(err.code, 'invalid_request');
      assert.match(err.message, /More than one Host header/);
      const line = await waitForLine(h, (l) => l.code === 'invalid_request' && l.route === 'chat.completions' && l.status === 400);
      assert.equal(line.key_id, null, 'refused before the key was looked up');
      assert.equal(up.received.length, forwarded, 'nothing reached the upstream');
      assert.equal(h.usage.length, usage, 'nothing billed');
      // GET /v1/key itself takes nothing: what is left is what was left before
      assert.equal(await remainingRequests(h.keys.k_rpm!), left, 'no request taken from the key');
    });
  }

  test('a Host that is not a host (a path, a fragment, user-info, a space, empty) is 400 before the decision; nothing forwarded', async () => {
    // an upstream that rebuilds its URL from Host would read another path than the one classified
    for (const value of ['x/v1/models?', 'x#', 'a@b', 'a b', '']) {
      const forwarded = up.received.length;
      const ex = await rawExchange(h.sidecar.port, [`POST /v1/chat/completions HTTP/1.1\r\nHost: ${value}\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n\r\n${CHAT}`], { expect: 1 });
      assert.equal(ex.responses[0]!.status, 400, value);
      const err = errorOf(ex.responses[0]!);
      assert.equal(err.code, 'invalid_request');
      assert.match(err.message, /Host header must be a host name/);
      assert.equal(up.received.length, forwarded, value);
    }
    for (const value of ['api.example:8443', '[::1]:80', 'my_host', '[fe80::1%25eth0]:8080']) {
      const ex = await rawExchange(h.sidecar.port, [`GET /v1/models HTTP/1.1\r\nHost: ${value}\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\n`], { expect: 1 });
      assert.equal(ex.responses[0]!.status, 200, value);
      assert.equal(up.received.at(-1)!.headers.host, value, 'forwarded as received');
    }
  });

  test('an HTTP/1.1 request without Host gets 400 with keyward\'s JSON body, in the route\'s style', async () => {
    const forwarded = up.received.length;
    const ex = await rawExchange(h.sidecar.port, [`POST /v1/messages HTTP/1.1\r\nx-api-key: ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n\r\n${CHAT}`], { expect: 1 });
    assert.equal(ex.responses[0]!.status, 400);
    const err = errorOf(ex.responses[0]!);
    assert.deepEqual([err.code, err.style], ['invalid_request', 'messages']);
    assert.match(err.message, /No Host header/);
    assert.equal(up.received.length, forwarded);
  });

  test('an HTTP/1.0 request without Host is forwarded (Host is HTTP/1.1\'s requirement)', async () => {
    const ex = await rawExchange(h.sidecar.port, [`GET /v1/models HTTP/1.0\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\n`]);
    assert.equal(ex.responses[0]!.status, 200, ex.bytes.toString('latin1'));
    assert.equal(up.received.at(-1)!.url, '/v1/models');
  });

  test('a path with no route is still 404 first, whatever its Host lines', async () => {
    const ex = await rawExchange(h.sidecar.port, [`GET /nope HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n`], { expect: 1 });
    assert.equal(ex.responses[0]!.status, 404);
    assert.equal(errorOf(ex.responses[0]!).code, 'not_found');
  });
});

describe('expectations other than 100-continue', () => {
  test('the path is classified first: 404 for no route, 400 invalid_path for an absolute-form target', async () => {
    const forwarded = up.received.length;
    for (const [target, status, code] of [['/nope', 404, 'not_found'], ['http://x/v1/models', 400, 'invalid_path'], ['/v1/models/%2e%2e', 400, 'invalid_path']] as const) {
      const ex = await rawExchange(h.sidecar.port, [`GET ${target} HTTP/1.1\r\nHost: kw\r\nExpect: foo\r\n\r\n`], { expect: 1 });
      assert.equal(ex.responses[0]!.status, status, target);
      assert.equal(errorOf(ex.responses[0]!).code, code, target);
    }
    assert.equal(up.received.length, forwarded);
  });

  test('100-continue beside another expectation (one line, or two) is 417 and nothing is forwarded', async () => {
    const forwarded = up.received.length;
    for (const lines of ['Expect: 100-continue, foo\r\n', 'Expect: 100-continue\r\nExpect: foo\r\n', 'Expect: 100-continue\r\nExpect: 100-continue\r\n']) {
      const ex = await rawExchange(h.sidecar.port, [`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${lines}Content-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n\r\n`]);
      assert.deepEqual(ex.responses.map((r) => r.status), [417], JSON.stringify(lines));
    }
    assert.equal(up.received.length, forwarded);
    // 100-continue alone, in any letter case, is answered 100 and the request goes on.
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    let got = '';
    const answered = new Promise<void>((resolve) => socket.on('data', (c: Buffer) => (got += c.toString('latin1')) && /^HTTP\/1\.1 200 /m.test(got) && resolve()));
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nExpect: 100-Continue\r\nContent-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n\r\n`);
    socket.once('data', () => socket.write(CHAT));
    await answered;
    socket.destroy();
    assert.match(got, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 /);
    assert.equal(up.received.length, forwarded + 1);
  });

  test('on a messages route, 417 in the messages style, counted and logged', async () => {
    const before = await metric('keyward_requests_total{route="messages",status="417",code="invalid_request"}');
    const ex = await rawExchange(h.sidecar.port, [`POST /v1/messages HTTP/1.1\r\nHost: kw\r\nx-api-key: ${h.keys.k_ok}\r\nExpect: 200-ok\r\nContent-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n\r\n${CHAT}`]);
    assert.equal(ex.responses.length, 1);
    assert.equal(ex.responses[0]!.status, 417);
    const err = errorOf(ex.responses[0]!);
    assert.deepEqual([err.code, err.style], ['invalid_request', 'messages']);
    assert.ok(ex.closed, 'the connection closes: the client may be sending its body anyway');
    await waitForLine(h, (l) => l.status === 417 && l.route === 'messages' && l.code === 'invalid_request');
    assert.equal(await metric('keyward_requests_total{route="messages",status="417",code="invalid_request"}'), before + 1);
  });
});

describe('CONNECT and the parser\'s refusals', () => {
  test('a CONNECT is counted and logged like any request', async () => {
    const before = await metric('keyward_requests_total{route="none",status="400",code="invalid_path"}');
    const ex = await rawExchange(h.sidecar.port, [`CONNECT upstream.example:443 HTTP/1.1\r\nHost: upstream.example:443\r\nx-request-id: connect-1\r\n\r\n`]);
    assert.equal(ex.responses[0]!.status, 400);
    assert.equal(ex.responses[0]!.headers['x-request-id'], 'connect-1', 'the answer names the id its access line logs');
    const line = await waitForLine(h, (l) => l.method === 'CONNECT');
    assert.deepEqual([line.status, line.code, line.route, line.req_id], [400, 'invalid_path', null, 'connect-1']);
    assert.equal(await metric('keyward_requests_total{route="none",status="400",code="invalid_path"}'), before + 1);
  });

  test('a raw byte outside ASCII in the request target is 400 invalid_path, as its percent-encoded form is', async () => {
    for (const target of [Buffer.from('/v1/models/g\u00e9', 'utf8'), Buffer.from('/v1/models/g%c3%a9')]) {
      const ex = await rawExchange(h.sidecar.port, [Buffer.concat([Buffer.from('GET '), target, Buffer.from(` HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\n`)])], { expect: 1 });
      assert.equal(ex.responses[0]!.status, 400);
      assert.equal(errorOf(ex.responses[0]!).code, 'invalid_path', target.toString('latin1'));
    }
  });

  test('bytes the parser refuses before any request are counted and logged: an access line with nothing of the request', async () => {
    const series = 'keyward_requests_total{route="none",status="400",code="invalid_path"}';
    const before = await metric(series);
    const logged = h.logs.length;
    const ex = await rawExchange(h.sidecar.port, [Buffer.from(`GET /v1/models/g\u00e9 HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\n`, 'utf8')], { expect: 1 });
    assert.equal(ex.responses[0]!.status, 400);
    // Found by the id the answer names: the earlier test's refusals, alike in every field, may be logged after this one began.
    const id = ex.responses[0]!.headers['x-request-id'];
    assert.ok(typeof id === 'string' && id.length > 0, 'the answer names an id');
    const line = await waitForLine(h, (l) => l.req_id === id);
    assert.deepEqual([line.method, line.status, line.code, line.route, line.path, line.key_id, line.client_ip], ['-', 400, 'invalid_path', null, '-', null, '127.0.0.1']);
    assert.ok(!h.logs.slice(logged).some((l) => l.includes(h.keys.k_ok!)), 'no line holds the key');
    assert.equal(await metric(series), before + 1);
  });

  test('a body the parser refuses midway on a messages route is answered in the messages style', async () => {
    const head = `POST /v1/messages HTTP/1.1\r\nHost: kw\r\nx-api-key: ${h.keys.k_ok}\r\nx-request-id: midway-1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
    const ex = await rawExchange(h.sidecar.port, [head, '5\r\n{"mod\r\nzz-not-a-chunk-size\r\n']);
    assert.equal(ex.responses[0]!.status, 400);
    const err = errorOf(ex.responses[0]!);
    assert.deepEqual([err.code, err.style], ['invalid_request', 'messages']);
    assert.equal(ex.responses[0]!.headers['x-request-id'], 'midway-1', 'the client\'s id, as its access line logs it');
    // Its access line says what the client read: 400, not a client gone (499).
    const line = await waitForLine(h, (l) => l.route === 'messages' && l.key_id === 'k_ok' && l.code === 'invalid_request');
    assert.deepEqual([line.status, line.req_id], [400, 'midway-1']);
  });
});

describe('response headers keyward writes itself', () => {
  test("an upstream's own x-keyward-shadow never reaches the client", async () => {
    up.setHandler((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-keyward-shadow': 'budget_from_upstream' });
      res.end('{}');
    });
    try {
      const res = await fetch(`${h.url}/v1/models`, { headers: { authorization: `Bearer ${h.keys.k_ok}` } });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('x-keyward-shadow'), null);
    } finally {
      up.setHandler(echoJson);
    }
  });
});
