/**
 * A client that half-closes after a body shorter than its Content-Length still gets the
 * whole answer (DESIGN section 5, error bodies): a 400 whose JSON body says the body was
 * cut short, with a content-length that matches it, and nothing complete reaches the
 * upstream.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { parseResponses } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_ok: {} } });
});
after(async () => {
  await h.close();
  await up.close();
});

/** Sends `head` and a partial body, half-closes, and reads everything until the sidecar closes. */
function halfClosed(head: string, partial: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = net.connect(h.sidecar.port, '127.0.0.1', () => {
      socket.write(head + partial);
      socket.end();
    });
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => resolve(Buffer.concat(chunks)));
  });
}

describe('a half-closed client', () => {
  for (const path of ['/v1/chat/completions', '/v1/embeddings', '/v1/files']) {
    test(`POST ${path} cut short gets a 400 with its whole JSON body`, async () => {
      const before = up.received.filter((r) => r.body.length === 100).length;
      const bytes = await halfClosed(
        `POST ${path} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n`,
        '{"model":"gpt-4o","input":"',
      );
      const [res] = parseResponses(bytes).responses;
      assert.ok(res, `an answer: ${bytes.toString('latin1')}`);
      assert.equal(res.status, 400);
      assert.equal(res.headers['x-keyward-error'], 'invalid_request');
      assert.equal(res.headers['content-type'], 'application/json');
      assert.equal(Number(res.headers['content-length']), res.body.length);
      const body = JSON.parse(res.body.toString()) as { error: { code: string; message: string; type: string } };
      assert.equal(body.error.code, 'invalid_request');
      assert.equal(body.error.type, 'invalid_request_error');
      assert.match(body.error.message, /cut short/);
      assert.equal(up.received.filter((r) => r.body.length === 100).length, before, 'no complete body reached the upstream');
    });
  }

  test('a HEAD with a body that half-closes gets one answer, without a body', async () => {
    const bytes = await halfClosed(`HEAD /v1/models HTTP/1.1\r\nHost: kw\r\nContent-Length: 10\r\n\r\n`, 'abc');
    const { responses, rest } = parseResponses(bytes, { headRequests: [0] });
    assert.equal(responses.length, 1, bytes.toString('latin1'));
    assert.equal(responses[0]!.status, 404);
    assert.equal(responses[0]!.body.length, 0, 'no body after a HEAD answer');
    assert.equal(rest.length, 0, 'nothing after the one answer');
  });
});
