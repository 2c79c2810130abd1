/**
 * A request body that stalls longer than `server.bodyIdleTimeoutMs` is cut with 408:
 * the upstream never receives a complete request, the key's concurrency slot comes back,
 * and a body that keeps arriving, however slowly overall, is not cut.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { parseResponses } from '../helpers/raw.js';
import { bearer, send } from '../helpers/http.js';

const IDLE_MS = 400;
let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_one: { concurrency: 1 } }, config: { server: { port: 0, bodyIdleTimeoutMs: IDLE_MS } } });
});
after(async () => {
  await h.close();
  await up.close();
});

/** Sends the head and part of a body, then nothing; resolves with the first response. */
async function stall(head: string, part: string): Promise<{ status: number; headers: Record<string, string>; closed: Promise<unknown>; socket: net.Socket }> {
  const socket = net.connect(h.sidecar.port, '127.0.0.1');
  await once(socket, 'connect');
  socket.write(head + part);
  const chunks: Buffer[] = [];
  const closed = once(socket, 'close');
  return new Promise((resolve) => {
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      const r = parseResponses(Buffer.concat(chunks)).responses[0];
      if (r) resolve({ status: r.status, headers: r.headers, closed, socket });
    });
  });
}

describe('stalled bodies', () => {
  test('a stalled upload on a files route is cut with 408 and gives back its concurrency slot', { timeout: 20_000 }, async () => {
    const before = up.received.length;
    const head = `POST /v1/files HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_one}\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n`;
    const r = await stall(head, 'x'.repeat(100));
    assert.equal(r.status, 408);
    assert.equal(r.headers['x-keyward-error'], 'invalid_request');
    assert.equal(r.headers.connection, 'close');
    await r.closed;
    assert.equal(up.received.length, before, 'the upstream never got a complete request');
    // concurrency 1: the slot must have come back for this to pass
    const next = await send(h.url, { method: 'GET', path: '/v1/files', headers: bearer(h.keys.k_one!) });
    assert.equal(next.status, 200);
  });

  test('a stalled chunked model body is cut with 408 before admission', { timeout: 20_000 }, async () => {
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_one}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
    const r = await stall(head, '5\r\n{"mod\r\n');
    assert.equal(r.status, 408);
    const before = up.received.length;
    // the rest of a valid body, after the 408: it must not go on to admission or the upstream
    r.socket.write('8\r\nel":"m"}\r\n0\r\n\r\n');
    await r.closed;
    assert.equal(up.received.length, before);
    const next = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.k_one!), 'content-type': 'application/json' }, body: '{"model":"m"}' });
    assert.equal(next.status, 200);
  });

  test('a stalled messages body: 408 in the messages style, logged with its route and key', { timeout: 20_000 }, async () => {
    const line = waitForLine(h, (l) => l.status === 408 && l.route === 'messages');
    const head = `POST /v1/messages HTTP/1.1\r\nHost: kw\r\nx-api-key: ${h.keys.k_one}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n`;
    const r = await stall(head, '{"model":');
    assert.equal(r.status, 408);
    await r.closed;
    const logged = await line;
    assert.equal(logged.key_id, 'k_one');
    assert.equal(logged.code, 'invalid_request');
  });

  test('a client gone mid-body: logged with its route and key, and no error line', { timeout: 20_000 }, async () => {
    const errorsBefore = h.logs.filter((l) => l.includes('"request failed"')).length;
    // 499 when the sidecar sees the connection go; when it reads the client's FIN first, the
    // answer to the cut body (408 from the body read, 400 from Node's parser) goes out on the
    // half-closed connection and is what the line says
    const line = waitForLine(h, (l) => [400, 408, 499].includes(l.status as number) && l.route === 'chat.completions');
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_one}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":`);
    // most often the sidecar is reading the body when the client leaves; either way the line names the route and key
    await new Promise((r) => setTimeout(r, 50));
    socket.destroy();
    const logged = await line;
    assert.equal(logged.key_id, 'k_one');
    assert.equal(h.logs.filter((l) => l.includes('"request failed"')).length, errorsBefore);
  });

  test('a body that keeps arriving is not cut, however long it takes in all', { timeout: 20_000 }, async () => {
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    const pieces = 8;
    socket.write(`POST /v1/files HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_one}\r\nContent-Length: ${pieces}\r\nConnection: close\r\n\r\n`);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    const closed = once(socket, 'close');
    // Total time is twice the idle timeout; no gap comes near it.
    for (let i = 0; i < pieces; i++) {
      await new Promise((r) => setTimeout(r, IDLE_MS / 4));
      socket.write('x');
    }
    await closed;
    assert.equal(parseResponses(Buffer.concat(chunks)).responses[0]?.status, 200);
  });
});

describe('a body that stalls while the upstream streams its answer', () => {
  let streaming: FakeUpstream;
  let paid: Harness;
  const DELTA = 'abcdefgh'.repeat(5);
  before(async () => {
    streaming = await startFakeUpstream();
    // Answers as soon as the head arrives, while the upload is still coming in.
    streaming.arrivals.on('head', (_req: unknown, res: import('node:http').ServerResponse) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let i = 0; i < 4; i++) res.write(`data: ${JSON.stringify({ type: 'transcript.text.delta', delta: DELTA })}\n\n`);
    });
    paid = await startHarness({
      upstream: streaming.url,
      keys: { k_paid: {} },
      records: [{ type: 'price', model: 'priced-*', input: 1, output: 1, per: 1_000_000 }],
      config: { server: { port: 0, bodyIdleTimeoutMs: IDLE_MS } },
    });
  });
  after(async () => {
    await paid.close();
    await streaming.close();
  });

  test('the output relayed before the cut is billed, and the line keeps the status the client saw', { timeout: 20_000 }, async () => {
    const line = waitForLine(paid, (l) => l.msg === 'request' && l.route === 'audio');
    const b = 'kwb';
    const part = `--${b}\r\nContent-Disposition: form-data; name="model"\r\n\r\npriced-transcribe\r\n--${b}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: application/octet-stream\r\n\r\n${'x'.repeat(2000)}`;
    const socket = net.connect(paid.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    socket.write(`POST /v1/audio/transcriptions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${paid.keys.k_paid}\r\nContent-Type: multipart/form-data; boundary=${b}\r\nContent-Length: ${part.length + 5000}\r\n\r\n${part}`);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    await once(socket, 'close');
    assert.equal(Buffer.concat(chunks).toString().split(DELTA).length - 1, 4, 'the client got the four deltas before the cut');
    const logged = await line;
    assert.equal(logged.status, 200, 'the status the client saw, not 499');
    assert.equal(logged.usage_estimated, true);
    assert.equal(logged.output_tokens, (4 * DELTA.length) / 4, 'the text relayed is billed, not the whole reservation');
    // logged before the access line, and naming the request
    const warned = paid.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'request cut: its body stalled after the response began');
    assert.equal(warned?.req_id, logged.req_id);
    const event = paid.usage.find((u) => u.request_id === logged.req_id);
    assert.equal(event?.output_tokens, logged.output_tokens, 'the usage event carries what the line says');
  });
});
