/**
 * Body limits at their exact boundary (DESIGN section 2), for bodies that declare no length
 * (chunked), which only the reading itself can hold to the limit: a body of limit bytes
 * passes; one past it is 413 body_too_large and nothing reaches the upstream, whether the
 * over-limit bytes arrive with the last chunk or not. Kept apart from upload-limit.test.ts,
 * whose limits are too large to cross byte by byte.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { chunked, rawExchange } from '../helpers/raw.js';
import { formBody } from '../helpers/form.js';

const JSON_LIMIT = 1024;
const UPLOAD_LIMIT = 2048;
const BOUNDARY = 'kw-limit-edge';
const FORM_CT = `multipart/form-data; boundary=${BOUNDARY}`;
let up: FakeUpstream;
let h: Harness;
// Counted as heads arrive: a forwarded request that was cut would never be `received`.
let heads = 0;

before(async () => {
  up = await startFakeUpstream();
  up.arrivals.on('head', () => void heads++);
  h = await startHarness({ upstream: up.url, keys: { k_ok: {} }, config: { server: { port: 0, maxJsonBodyBytes: JSON_LIMIT, maxUploadBytes: UPLOAD_LIMIT } } });
});
after(async () => {
  await h.close();
  await up.close();
});

/** A JSON chat body of exactly `size` bytes. */
function jsonOf(size: number): string {
  const base = '{"model":"gpt-4o","pad":""}';
  const body = `{"model":"gpt-4o","pad":"${'x'.repeat(size - base.length)}"}`;
  assert.equal(Buffer.byteLength(body), size);
  return body;
}

/** A multipart transcription body of exactly `size` bytes (model field, then a file part). */
function formOf(size: number): Buffer {
  const parts = (file: Buffer) => formBody(BOUNDARY, [{ name: 'model', value: 'whisper-1' }, { name: 'file', filename: 'a.wav', value: file }]);
  const form = parts(Buffer.alloc(size - parts(Buffer.alloc(0)).length, 0x61));
  assert.equal(form.length, size);
  return form;
}

/** Sends head and chunked body in one write; the answer and how many heads the upstream saw. */
async function sendChunked(path: string, contentType: string, body: Buffer | string): Promise<{ status: number; code: string | undefined; heads: number }> {
  const before = heads;
  const head = `POST ${path} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: ${contentType}\r\nTransfer-Encoding: chunked\r\n\r\n`;
  const ex = await rawExchange(h.sidecar.port, [Buffer.concat([Buffer.from(head), chunked(body)])], { expect: 1 });
  const r = ex.responses[0]!;
  if (r.status !== 200) {
    // No event marks a request that was never sent: give one that was time to arrive.
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return { status: r.status, code: r.headers['x-keyward-error'], heads: heads - before };
}

describe('body limits at the boundary, chunked', () => {
  test('a chunked JSON body of exactly maxJsonBodyBytes is forwarded whole', async () => {
    const r = await sendChunked('/v1/chat/completions', 'application/json', jsonOf(JSON_LIMIT));
    assert.equal(r.status, 200);
    assert.equal(r.heads, 1);
    assert.equal(up.received.at(-1)!.body.length, JSON_LIMIT);
  });

  test('a chunked JSON body one byte over maxJsonBodyBytes is 413 and never forwarded', async () => {
    const r = await sendChunked('/v1/chat/completions', 'application/json', jsonOf(JSON_LIMIT + 1));
    assert.deepEqual([r.status, r.code, r.heads], [413, 'body_too_large', 0]);
  });

  test('a chunked multipart body of exactly maxUploadBytes is forwarded whole', async () => {
    const r = await sendChunked('/v1/audio/transcriptions', FORM_CT, formOf(UPLOAD_LIMIT));
    assert.equal(r.status, 200);
    assert.equal(up.received.at(-1)!.body.length, UPLOAD_LIMIT);
  });

  test('a chunked multipart body over maxUploadBytes that arrives in one chunk is 413 and never forwarded', async () => {
    const r = await sendChunked('/v1/audio/transcriptions', FORM_CT, formOf(UPLOAD_LIMIT + 500));
    assert.deepEqual([r.status, r.code, r.heads], [413, 'body_too_large', 0], 'an over-limit body must not reach the upstream');
  });
});
