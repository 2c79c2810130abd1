/**
 * server.maxUploadBytes (DESIGN section 2): multipart bodies on model routes and files
 * bodies stream through unbuffered, held to maxUploadBytes and not to maxJsonBodyBytes.
 * A declared length over the limit is refused at once with 413 body_too_large (in the
 * route's error style); a chunked body that goes over mid-stream is cut — 413 while no
 * answer has begun, else the upstream request is aborted and the client's response cut —
 * and everything its admission took (concurrency slot, TPM reservation, spend hold) is
 * given back.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { randomBytes } from 'node:crypto';
import { sha256, type FakeUpstream, type Received } from '../helpers/upstream.js';
import { startBehindUpstream, waitForLine, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';
import { openSlowClient } from '../helpers/slow-client.js';
import { rawExchange } from '../helpers/raw.js';
import { formBody, partHead } from '../helpers/form.js';

const LIMIT = 1 << 20;
const JSON_LIMIT = 4096;
const BOUNDARY = 'kw-upload-limit-boundary';
let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;

before(async () => {
  ({ up, h, close } = await startBehindUpstream({
    keys: {
      k_files: { concurrency: 1 },
      k_scoped: { models: ['gpt-4o'] },
      k_meter: { project: 'p_up', budget: 100, spent: 0, tpm: 6000, concurrency: 1 },
      k_chunked: { project: 'p_up' },
    },
    records: [
      { type: 'project', id: 'p_up', status: 'enabled', budget: null, spent: 0 },
      { type: 'price', model: 'whisper-*', input: 1, output: 1, per: 1000 },
    ],
    config: { server: { port: 0, maxJsonBodyBytes: JSON_LIMIT, maxUploadBytes: LIMIT } },
  }));
});
after(() => close());

/** The next request the upstream sees, with a running count of the body bytes it has read. */
function nextArrival(): Promise<{ req: IncomingMessage; res: ServerResponse; rec: Received; bytes: () => number; reached(n: number): Promise<void> }> {
  return new Promise((resolve) => {
    up.arrivals.once('head', (req: IncomingMessage, res: ServerResponse, rec: Received) => {
      let bytes = 0;
      const waiters: { n: number; resolve: () => void }[] = [];
      req.on('data', (c: Buffer) => {
        bytes += c.length;
        for (const w of waiters.filter((w) => bytes >= w.n)) w.resolve();
      });
      resolve({
        req, res, rec,
        bytes: () => bytes,
        reached: (n) => (bytes >= n ? Promise.resolve() : new Promise((r) => waiters.push({ n, resolve: r }))),
      });
    });
  });
}

const fileHead = (auth: string, extra: string) => `POST /v1/files HTTP/1.1\r\nHost: kw\r\n${auth}\r\n${extra}\r\n`;
const keyInfo = async (key: string) =>
  (await send(h.url, { path: '/v1/key', headers: bearer(key) })).json<{ remaining: { tokens: number }; budget: { spent: number } }>();

describe('maxUploadBytes', () => {
  test('a files body declared over the limit is refused at once with 413 (openai style), before any of it is sent', async () => {
    // Counted as heads arrive: a forwarded request that never ends would never be `received`.
    let heads = 0;
    const countHead = () => void heads++;
    up.arrivals.on('head', countHead);
    const c = await openSlowClient(h.sidecar.port);
    // Only the head: the answer must not wait for a body.
    await c.write(fileHead(`Authorization: Bearer ${h.keys.k_files}`, `Content-Type: application/octet-stream\r\nContent-Length: ${LIMIT + 1}\r\n`));
    const r = await c.response();
    assert.equal(r.status, 413);
    assert.equal(r.headers['x-keyward-error'], 'body_too_large');
    assert.equal(r.headers['content-type'], 'application/json');
    assert.equal(r.headers.connection, 'close');
    const body = JSON.parse(r.body.toString('utf8')) as { error: { code: string; type: string; message: string } };
    assert.equal(body.error.code, 'body_too_large');
    assert.equal(body.error.type, 'invalid_request_error');
    assert.match(body.error.message, new RegExp(String(LIMIT)));
    c.socket.destroy();
    up.arrivals.off('head', countHead);
    assert.equal(heads, 0, 'nothing reached the upstream');
  });

  test('with Expect: 100-continue, a files body declared over the limit is answered 413 without a 100 Continue', async () => {
    const c = await openSlowClient(h.sidecar.port);
    await c.write(fileHead(`Authorization: Bearer ${h.keys.k_files}`, `Content-Length: ${LIMIT + 1}\r\nExpect: 100-continue\r\n`));
    const r = await c.response();
    assert.equal(r.status, 413);
    assert.ok(c.received().toString('latin1').startsWith('HTTP/1.1 413 '), 'the first thing sent back is the refusal');
    c.socket.destroy();
  });

  test('with Expect: 100-continue, a multipart model body declared over the limit is answered 413 without a 100 Continue', async () => {
    const c = await openSlowClient(h.sidecar.port);
    await c.write(`POST /v1/audio/transcriptions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_files}\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nContent-Length: ${LIMIT + 1}\r\nExpect: 100-continue\r\n\r\n`);
    const r = await c.response();
    assert.equal(r.status, 413);
    assert.ok(c.received().toString('latin1').startsWith('HTTP/1.1 413 '), 'the first thing sent back is the refusal');
    c.socket.destroy();
  });

  // Node drains a small unread body after the answer by itself, but not one already piped
  // into the replay: without the drain the next request on the connection waits for ever.
  test('a small multipart body refused after its head was read leaves the keep-alive connection usable', async () => {
    const form = formBody(BOUNDARY, [
      { name: 'model', value: 'whisper-1' },
      { name: 'file', filename: 'a.wav', value: randomBytes(60 * 1024) },
    ]);
    const head = `POST /v1/audio/transcriptions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_scoped}\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nContent-Length: ${form.length}\r\n\r\n`;
    const next = `GET /v1/models HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_files}\r\n\r\n`;
    const r = await rawExchange(h.sidecar.port, [Buffer.concat([Buffer.from(head), form.subarray(0, 1024)]), form.subarray(1024), next], { expect: 2, timeoutMs: 4000 });
    assert.deepEqual(r.responses.map((x) => x.status), [403, 200]);
    assert.equal(r.responses[0]!.headers['x-keyward-error'], 'model_not_allowed');
  });

  test('a multipart body on the messages route declared over the limit is 413 in the messages style', async () => {
    const c = await openSlowClient(h.sidecar.port);
    await c.write(`POST /v1/messages HTTP/1.1\r\nHost: kw\r\nx-api-key: ${h.keys.k_files}\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nContent-Length: ${LIMIT + 1}\r\n\r\n`);
    const r = await c.response();
    assert.equal(r.status, 413);
    assert.equal(r.headers['x-keyward-error'], 'body_too_large');
    const body = JSON.parse(r.body.toString('utf8')) as { type: string; error: { type: string } };
    assert.equal(body.type, 'error');
    assert.equal(body.error.type, 'request_too_large');
    c.socket.destroy();
  });

  // Both bodies are far over maxJsonBodyBytes and within maxUploadBytes. The second half is
  // sent only once the upstream has read the first: a sidecar that buffered the body would
  // never pass this point.
  for (const kind of ['files', 'multipart model'] as const) {
    test(`a ${kind} body is held to maxUploadBytes, not maxJsonBodyBytes, and streams through before it has ended`, { timeout: 20_000 }, async () => {
      const file = randomBytes(LIMIT - 4096);
      const body = formBody(BOUNDARY, [...(kind === 'files' ? [{ name: 'purpose', value: 'assistants' }] : [{ name: 'model', value: 'gpt-4o-transcribe' }]), { name: 'file', value: file, filename: 'a.bin' }]);
      assert.ok(body.length > JSON_LIMIT && body.length <= LIMIT);
      const path = kind === 'files' ? '/v1/files' : '/v1/audio/transcriptions';
      const c = await openSlowClient(h.sidecar.port);
      const arrival = nextArrival();
      const half = body.length >> 1;
      await c.write(`POST ${path} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_files}\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nContent-Length: ${body.length}\r\n\r\n`);
      await c.write(body.subarray(0, half));
      // A refusal would answer instead of forwarding: fail on it rather than wait.
      const a = await Promise.race([arrival, c.response().then((r) => assert.fail(`answered ${r.status} ${r.body.toString('utf8')}`))]);
      await a.reached(half);
      assert.equal(a.bytes(), half, 'the upstream has what was sent so far, and nothing more');
      await c.write(body.subarray(half));
      const r = await c.response();
      assert.equal(r.status, 200);
      assert.equal((await a.rec.closed), 'complete');
      assert.equal(a.rec.sha256, sha256(body));
      assert.equal(a.rec.headers['content-type'], `multipart/form-data; boundary=${BOUNDARY}`);
      c.socket.destroy();
    });
  }

  /** A chunked files upload under way: its first 256 KiB piece sent and its request at the upstream. */
  const startChunkedUpload = async () => {
    const c = await openSlowClient(h.sidecar.port);
    const arrival = nextArrival();
    await c.write(fileHead(`Authorization: Bearer ${h.keys.k_files}`, 'Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n'));
    const piece = randomBytes(256 * 1024);
    await c.chunk(piece);
    return { c, piece, a: await arrival };
  };

  test('a chunked files body that passes the limit mid-stream is cut with 413; the upstream request is aborted and the slot comes back', { timeout: 20_000 }, async () => {
    const { c, piece, a } = await startChunkedUpload();
    const answered = c.response();
    // Five pieces are 1.25 MiB: the limit is passed during the fifth.
    for (let i = 1; i < 5; i++) await c.chunk(piece);
    const r = await answered;
    assert.equal(r.status, 413);
    assert.equal(r.headers['x-keyward-error'], 'body_too_large');
    assert.equal(r.headers.connection, 'close');
    assert.equal((JSON.parse(r.body.toString('utf8')) as { error: { code: string } }).error.code, 'body_too_large');
    assert.equal(await a.rec.closed, 'aborted');
    assert.ok(a.bytes() <= LIMIT, `the upstream read ${a.bytes()} bytes, never past the limit`);
    await c.closed;
    // concurrency 1: this passes only if the cut request gave its slot back
    const next = await send(h.url, { method: 'GET', path: '/v1/files', headers: bearer(h.keys.k_files!) });
    assert.equal(next.status, 200);
  });

  test('a chunked multipart model body cut mid-stream gives back its TPM reservation, spend hold and slot', { timeout: 20_000 }, async () => {
    const key = h.keys.k_meter!;
    const before = await keyInfo(key);
    assert.equal(before.remaining.tokens, 6000);
    assert.equal(before.budget.spent, 0);
    const c = await openSlowClient(h.sidecar.port);
    const arrival = nextArrival();
    await c.write(`POST /v1/audio/transcriptions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${key}\r\nx-request-id: cut-multipart\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nTransfer-Encoding: chunked\r\n\r\n`);
    await c.chunk(Buffer.concat([partHead(BOUNDARY, { name: 'model' }), Buffer.from('whisper-1\r\n'), partHead(BOUNDARY, { name: 'file', filename: 'a.wav' })]));
    const a = await arrival;
    // In flight: the reservation and the hold are taken.
    const during = await keyInfo(key);
    assert.ok(during.remaining.tokens < 6000 - 500, `tokens reserved: ${during.remaining.tokens} left`);
    assert.ok(during.budget.spent > 1, `held: ${during.budget.spent}`);
    const answered = c.response();
    const piece = randomBytes(256 * 1024);
    for (let i = 0; i < 5; i++) await c.chunk(piece);
    const r = await answered;
    assert.equal(r.status, 413);
    assert.equal(r.headers['x-keyward-error'], 'body_too_large');
    assert.equal(await a.rec.closed, 'aborted');
    const line = await waitForLine(h, (l) => l.req_id === 'cut-multipart');
    assert.equal(line.code, 'body_too_large');
    assert.equal(line.model, 'whisper-1');
    const afterCut = await keyInfo(key);
    assert.equal(afterCut.remaining.tokens, 6000, 'the TPM reservation came back');
    assert.equal(afterCut.budget.spent, 0, 'the spend hold was released');
    assert.equal(h.usage.filter((u) => u.request_id === 'cut-multipart').length, 0, 'nothing was billed');
    const next = await send(h.url, {
      method: 'POST', path: '/v1/audio/transcriptions',
      headers: { ...bearer(key), 'content-type': `multipart/form-data; boundary=${BOUNDARY}` },
      body: formBody(BOUNDARY, [{ name: 'model', value: 'whisper-1' }, { name: 'file', value: 'tiny', filename: 'a.wav' }]),
    });
    assert.equal(next.status, 200, 'the concurrency slot came back');
  });

  test('a chunked multipart model body is billed by its whole size, not by what was read before admission', { timeout: 20_000 }, async () => {
    const file = randomBytes(40_000);
    const body = formBody(BOUNDARY, [{ name: 'model', value: 'whisper-1' }, { name: 'file', value: file, filename: 'a.wav' }]);
    const c = await openSlowClient(h.sidecar.port);
    const arrival = nextArrival();
    await c.write(`POST /v1/audio/transcriptions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_chunked}\r\nx-request-id: chunked-size\r\nContent-Type: multipart/form-data; boundary=${BOUNDARY}\r\nTransfer-Encoding: chunked\r\n\r\n`);
    // The fields and the file's head first: the request is admitted and forwarded on these few bytes.
    const cut = body.indexOf('\r\n\r\n', body.indexOf('name="file"')) + 4 + 16;
    await c.chunk(body.subarray(0, cut));
    await arrival;
    const answered = c.response();
    await c.chunk(body.subarray(cut));
    await c.write('0\r\n\r\n');
    assert.equal((await answered).status, 200);
    const line = await waitForLine(h, (l) => l.req_id === 'chunked-size');
    // No usage in the answer: the prompt estimate is ceil(body bytes / 4) of the whole body.
    assert.ok(Number(line.input_tokens) >= Math.ceil(body.length / 4), `billed ${line.input_tokens} input tokens for ${body.length} bytes`);
    assert.equal(line.usage_estimated, true);
  });

  test('a body that passes the limit after the upstream began its answer: the upstream request is aborted and the response cut', { timeout: 20_000 }, async () => {
    const { c, piece, a } = await startChunkedUpload();
    // The upstream answers before the body has ended, as some upload endpoints do.
    a.res.writeHead(200, { 'content-type': 'text/plain', 'transfer-encoding': 'chunked' });
    a.res.write('accepting');
    const head = await c.head();
    assert.equal(head.status, 200);
    for (let i = 1; i < 5 && !c.socket.destroyed; i++) await c.chunk(piece);
    assert.equal(await a.rec.closed, 'aborted');
    await c.closed;
    assert.ok(!c.received().includes('0\r\n\r\n'), 'the client never saw a complete response');
    const next = await send(h.url, { method: 'GET', path: '/v1/files', headers: bearer(h.keys.k_files!) });
    assert.equal(next.status, 200, 'the concurrency slot came back');
  });
});
