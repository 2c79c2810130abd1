/**
 * Framing (DESIGN section 5): a body reaches the upstream framed as it was received, on
 * every method and route class, or the request is refused with 400; a body never
 * follows a zero-length framing. Raw sockets on both sides of the sidecar.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { maxHeaderSize } from 'node:http';
import net from 'node:net';
import { once } from 'node:events';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { chunked, parseResponses, rawExchange } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_ok: {}, k_rpm: { rpm: 2 } } });
});
after(async () => {
  await h.close();
  await up.close();
});

const SMUGGLED = 'GET /v1/files/secret HTTP/1.1\r\nHost: up\r\nX-Smuggled: 1\r\n\r\n';

function framingOf(rawHeaders: string[]): { te: string | null; cl: string | null } {
  let te: string | null = null;
  let cl: string | null = null;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name === 'transfer-encoding') te = rawHeaders[i + 1]!;
    if (name === 'content-length') cl = rawHeaders[i + 1]!;
  }
  return { te, cl };
}

const routes = [
  { path: '/v1/files/file-1', cls: 'files' },
  { path: '/v1/files', cls: 'files' },
  { path: '/v1/uploads/up-1/parts', cls: 'files' },
  { path: '/v1/models/gpt-4o', cls: 'listing' },
  { path: '/v1/responses/resp_1', cls: 'model' },
];
const methods = ['GET', 'HEAD', 'DELETE', 'OPTIONS', 'POST', 'PUT', 'PATCH'];

describe('framing is preserved or refused', () => {
  for (const r of routes) {
    for (const method of methods) {
      test(`${method} ${r.path} with a chunked body that looks like a request`, async () => {
        const before = up.received.length;
        const head = `${method} ${r.path} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n`;
        const ex = await rawExchange(h.sidecar.port, [head, chunked(SMUGGLED)], { headRequests: method === 'HEAD' ? [0] : [] });
        assert.equal(ex.responses.length, 1, `one response, got ${ex.bytes.toString('latin1')}`);
        const status = ex.responses[0]!.status;
        const forwarded = up.received.slice(before);
        if (status === 200) {
          assert.equal(forwarded.length, 1);
          const rec = forwarded[0]!;
          assert.equal(rec.method, method);
          assert.deepEqual(framingOf(rec.rawHeaders), { te: 'chunked', cl: null }, 'chunked stays chunked');
          assert.equal(rec.body.toString('latin1'), SMUGGLED, 'the body arrives as a body, not as a second request');
        } else {
          assert.ok([400, 404].includes(status), `refused with 400/404, got ${status}`);
          assert.equal(forwarded.length, 0);
        }
        assert.ok(!up.received.some((x) => x.headers['x-smuggled']), 'no request reached the upstream that was not sent as one');
      });

      test(`${method} ${r.path} with a content-length body keeps its exact length`, async () => {
        const before = up.received.length;
        const body = '{"x":1}';
        const head = `${method} ${r.path} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`;
        const ex = await rawExchange(h.sidecar.port, [head, body], { headRequests: method === 'HEAD' ? [0] : [] });
        assert.equal(ex.responses.length, 1);
        const forwarded = up.received.slice(before);
        if (ex.responses[0]!.status === 200) {
          assert.equal(forwarded.length, 1);
          assert.deepEqual(framingOf(forwarded[0]!.rawHeaders), { te: null, cl: String(body.length) });
          assert.equal(forwarded[0]!.body.toString(), body);
        } else {
          assert.equal(forwarded.length, 0);
        }
      });
    }
  }

  test('a transfer-coding other than plain chunked is refused, not re-framed', async () => {
    const before = up.received.length;
    const head = `POST /v1/files HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n`;
    const ex = await rawExchange(h.sidecar.port, [head, chunked('abc')]);
    assert.equal(ex.responses[0]!.status, 400);
    assert.equal(ex.responses[0]!.headers['x-keyward-error'], 'invalid_request');
    assert.equal(up.received.length, before);
  });

  test('a transfer-coding refusal on a model route takes nothing from the key\'s RPM', async () => {
    const before = up.received.length;
    const body = '{"model":"gpt-4o","messages":[]}';
    const send = (te: string) =>
      rawExchange(h.sidecar.port, [`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_rpm}\r\nContent-Type: application/json\r\nTransfer-Encoding: ${te}\r\nConnection: close\r\n\r\n`, chunked(body)], { expect: 1 });
    for (const te of ['identity, chunked', 'gzip, chunked']) {
      const ex = await send(te);
      assert.equal(ex.responses[0]!.status, 400, te);
      assert.match(ex.responses[0]!.body.toString(), /Transfer-Encoding: chunked/);
    }
    assert.equal(up.received.length, before);
    // a bucket of 2 that the refusals had drained would answer 429 here
    assert.equal((await send('chunked')).responses[0]!.status, 200);
  });

  test('a parser refusal answers with its body when a header name merely contains HEAD', async () => {
    const ex = await rawExchange(h.sidecar.port, ['GET /v1/models HTTP/1.1\r\nHost: kw\r\nX-HEAD-Fold: a\r\n b\r\n\r\n']);
    assert.equal(ex.responses[0]!.status, 400);
    assert.equal(JSON.parse(ex.responses[0]!.body.toString()).error.code, 'invalid_request');
  });

  test('a parser refusal on a reused connection answers with its body, once the request before it was answered', async () => {
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.write(`GET /v1/models HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\n`);
    while (parseResponses(Buffer.concat(chunks)).responses.length < 1) await once(socket, 'data');
    socket.write('GET /v1/models HTTP/1.1\r\nHost: kw\r\nX-Fold: a\r\n b\r\n\r\n');
    await once(socket, 'close');
    const [first, refused] = parseResponses(Buffer.concat(chunks)).responses;
    assert.equal(first!.status, 200);
    assert.equal(refused!.status, 400);
    assert.equal(JSON.parse(refused!.body.toString()).error.code, 'invalid_request');
  });

  test('a parser refusal of a pipelined HEAD whose start line came with the request before has no body', async () => {
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.write(`GET /v1/models HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\nHEAD /v1/models HTTP/1.1\r\nHost: kw\r\n`);
    while (parseResponses(Buffer.concat(chunks)).responses.length < 1) await once(socket, 'data');
    const firstEnd = Buffer.concat(chunks).length;
    socket.write('Bad Header Line\r\n\r\n');
    await once(socket, 'close');
    const second = Buffer.concat(chunks).toString('latin1', firstEnd);
    assert.match(second, /^HTTP\/1\.1 400 /);
    assert.equal(second.slice(second.indexOf('\r\n\r\n') + 4), '', 'nothing a HEAD client would read as the next response');
  });

  test('a parser refusal of a HEAD request has no body', async () => {
    const ex = await rawExchange(h.sidecar.port, ['HEAD /v1/models HTTP/1.1\r\nHost: kw\r\nBad Header Line\r\n\r\n']);
    const text = ex.bytes.toString('latin1');
    assert.match(text, /^HTTP\/1\.1 400 /);
    const [head, rest] = [text.slice(0, text.indexOf('\r\n\r\n')), text.slice(text.indexOf('\r\n\r\n') + 4)];
    assert.equal(rest, '', 'nothing after the head');
    assert.match(head, /x-keyward-error: invalid_request/i);
  });

  test('a parser refusal of a HEAD request whose start line came in an earlier packet has no body', async () => {
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    socket.write('HEAD /v1/models HTTP/1.1\r\nHost: kw\r\n');
    // the first packet is accepted by the parser; the second one breaks it
    await new Promise((r) => setImmediate(r));
    socket.write('GET / HTTP/1.1\r\n\r\n');
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    await once(socket, 'close');
    const text = Buffer.concat(chunks).toString('latin1');
    assert.match(text, /^HTTP\/1\.1 400 /);
    assert.equal(text.slice(text.indexOf('\r\n\r\n') + 4), '');
  });

  test('a CONNECT gets 400 invalid_path with its JSON body, reaches nothing and closes the connection', async () => {
    const before = up.received.length;
    const target = new URL(up.url).host;
    const ex = await rawExchange(h.sidecar.port, [`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: up\r\n\r\n`]);
    assert.equal(ex.responses.length, 1, ex.bytes.toString('latin1'));
    const [res] = ex.responses;
    assert.equal(res!.status, 400);
    assert.equal(res!.headers['x-keyward-error'], 'invalid_path');
    assert.equal(res!.headers['content-type'], 'application/json');
    assert.equal(res!.headers.connection, 'close');
    assert.equal(Number(res!.headers['content-length']), res!.body.length);
    const body = JSON.parse(res!.body.toString()) as { error: { code: string; type: string; message: string } };
    assert.equal(body.error.code, 'invalid_path');
    assert.equal(body.error.type, 'invalid_request_error');
    assert.match(body.error.message, /CONNECT/);
    assert.equal(parseResponses(ex.bytes).rest.length, 0, 'nothing after the one answer');
    assert.ok(ex.closed, 'the connection closed');
    assert.equal(up.received.length, before, 'nothing reached the upstream');
  });

  test('an expectation other than 100-continue gets 417 with its JSON body, reaches nothing and closes the connection', async () => {
    const before = up.received.length;
    const body = '{"model":"gpt-4o","messages":[]}';
    const ex = await rawExchange(h.sidecar.port, [`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nExpect: 200-ok\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`]);
    assert.equal(ex.responses.length, 1, ex.bytes.toString('latin1'));
    const [res] = ex.responses;
    assert.equal(res!.status, 417);
    assert.equal(res!.headers['x-keyward-error'], 'invalid_request');
    assert.equal(res!.headers['content-type'], 'application/json');
    const json = JSON.parse(res!.body.toString()) as { error: { code: string; message: string } };
    assert.equal(json.error.code, 'invalid_request');
    assert.match(json.error.message, /100-continue/);
    assert.ok(ex.closed, 'the connection closed');
    assert.equal(up.received.length, before, 'nothing reached the upstream');
  });

  test('a request head past Node\'s header limit gets 431 with a JSON body naming the limit', async () => {
    const before = up.received.length;
    const big = 'a'.repeat(maxHeaderSize + 1);
    const ex = await rawExchange(h.sidecar.port, [`GET /v1/models HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nX-Big: ${big}\r\n\r\n`]);
    assert.equal(ex.responses.length, 1, ex.bytes.toString('latin1').slice(0, 300));
    const [res] = ex.responses;
    assert.equal(res!.status, 431);
    assert.equal(res!.headers['x-keyward-error'], 'invalid_request');
    assert.equal(Number(res!.headers['content-length']), res!.body.length);
    const body = JSON.parse(res!.body.toString()) as { error: { code: string; type: string; message: string } };
    assert.equal(body.error.code, 'invalid_request');
    assert.equal(body.error.type, 'invalid_request_error');
    assert.match(body.error.message, new RegExp(`larger than ${maxHeaderSize} bytes`));
    assert.ok(ex.closed);
    assert.equal(up.received.length, before, 'nothing reached the upstream');
  });

  test('a parser refusal of a GET request still explains itself', async () => {
    const ex = await rawExchange(h.sidecar.port, ['GET /v1/models HTTP/1.1\r\nHost: kw\r\nBad Header Line\r\n\r\n']);
    assert.equal(ex.responses[0]!.status, 400);
    assert.match(ex.responses[0]!.body.toString(), /invalid_request/);
  });
});
