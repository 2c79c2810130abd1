/**
 * A 40 MiB file through `client.files.create` (openai@6) arrives at the upstream byte for
 * byte — same length, same sha256, same boundary, the file intact inside its part — on a
 * sidecar whose maxJsonBodyBytes is far smaller (files bodies answer to maxUploadBytes),
 * and an upload over maxUploadBytes is refused with 413 body_too_large before it reaches
 * the upstream.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import OpenAI, { toFile } from 'openai';
import { startFakeUpstream, sha256, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { apiLike } from '../helpers/api-like.js';

const MiB = 1 << 20;
const MAX_UPLOAD = 48 * MiB;
let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream(apiLike);
  h = await startHarness({ upstream: up.url, keys: { k_ok: {} }, config: { server: { port: 0, maxJsonBodyBytes: MiB, maxUploadBytes: MAX_UPLOAD } } });
});
after(async () => {
  await h.close();
  await up.close();
});

/** The client's own fetch, teed: what goes on the wire is untouched, a copy of each POST body is kept. */
function capturingFetch(sent: { contentType: string | null; body: Buffer }[]): typeof fetch {
  return async (input, init) => {
    const request = new Request(input, init);
    if (request.method === 'POST') {
      const copy = request.clone();
      sent.push({ contentType: copy.headers.get('content-type'), body: Buffer.from(await copy.arrayBuffer()) });
    }
    return fetch(request);
  };
}

const client = (extra: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
  new OpenAI({ apiKey: h.keys.k_ok!, baseURL: `${h.url}/v1`, maxRetries: 0, timeout: 60_000, ...extra });

describe('files.create through keyward', () => {
  test('a 40 MiB file arrives byte for byte, boundary unchanged', { timeout: 120_000 }, async () => {
    // Boundary-looking runs and CRLFs first, then random bytes.
    const file = Buffer.concat([Buffer.from('\r\n--\r\n------formdata-undici-0\r\n--\r\n'), randomBytes(40 * MiB)]);
    const sent: { contentType: string | null; body: Buffer }[] = [];
    const before = up.received.length;
    const created = await client({ fetch: capturingFetch(sent) }).files.create({ file: await toFile(file, 'big.bin'), purpose: 'assistants' });
    assert.equal(created.id, 'file-e2e');
    assert.equal(up.received.length, before + 1);
    const rec = up.received.at(-1)!;
    const out = sent[0]!;
    assert.ok(out.body.length > 40 * MiB);
    assert.match(out.contentType ?? '', /^multipart\/form-data; boundary=/);
    assert.equal(rec.headers['content-type'], out.contentType, 'boundary untouched');
    assert.equal(rec.headers['content-length'], String(out.body.length));
    assert.equal(rec.body.length, out.body.length);
    assert.equal(rec.sha256, sha256(out.body), 'the upstream received the bytes the client sent');
    const boundary = /boundary=(.+)$/.exec(out.contentType!)![1]!;
    const at = rec.body.indexOf(file.subarray(0, 4096));
    assert.ok(at > 0);
    assert.equal(sha256(rec.body.subarray(at, at + file.length)), sha256(file), 'the file sits intact in its part');
    assert.ok(rec.body.subarray(0, at).toString('latin1').includes(`--${boundary}\r\n`));
    assert.ok(rec.body.subarray(at + file.length).toString('latin1').startsWith(`\r\n--${boundary}`));
    assert.ok(rec.body.toString('latin1', rec.body.length - 200).endsWith(`\r\n--${boundary}--\r\n`));
  });

  test('an upload over maxUploadBytes is 413 body_too_large and never reaches the upstream', { timeout: 120_000 }, async () => {
    const before = up.received.length;
    const err = await client()
      .files.create({ file: await toFile(Buffer.alloc(MAX_UPLOAD + 1, 7), 'huge.bin'), purpose: 'assistants' })
      .then(() => assert.fail('expected 413'), (e: unknown) => e);
    assert.ok(err instanceof OpenAI.APIError, `expected an API error, got ${String(err)}`);
    assert.equal(err.status, 413);
    assert.equal(err.code, 'body_too_large');
    assert.equal(err.headers.get('x-keyward-error'), 'body_too_large');
    assert.equal(up.received.length, before);
  });
});
