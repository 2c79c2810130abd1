/**
 * Bytes the parser refuses behind a whole request on the same connection (a malformed
 * pipelined request, a Content-Length one short) are answered only after that request's
 * answer: never in its place, never inside its stream, and the request is not cut (so
 * not billed as a client gone). After `Connection: close` they are not answered at all.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { rawExchange } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;

const CHAT = '{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}';
const REPLY = '{"id":"c1","choices":[{"message":{"content":"hello"}}],"usage":{"prompt_tokens":10,"completion_tokens":5}}';
const STREAM = ['data: {"choices":[{"delta":{"content":"a"}}]}\n\n', 'data: {"choices":[{"delta":{"content":"b"}}]}\n\n', 'data: [DONE]\n\n'];

before(async () => {
  up = await startFakeUpstream((req, res) => {
    if (req.headers['x-test'] === 'stream') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let i = 0;
      const next = () => (i < STREAM.length - 1 ? res.write(STREAM[i++]!, () => setImmediate(next)) : res.end(STREAM[i]!));
      return void next();
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(REPLY);
  });
  h = await startHarness({ upstream: up.url, keys: { k_ok: {} } });
});
after(async () => {
  await h.close();
  await up.close();
});

/** The chat request and, in the same write, bytes no parser takes as a request. */
const chatThenGarbage = (headers: string) =>
  `POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${CHAT.length}\r\n${headers}\r\n${CHAT}NOT HTTP AT ALL\r\n\r\n`;

test('a refused pipelined request is answered after the whole answer before it, which is not cut', async () => {
  for (const mode of ['json', 'stream']) {
    const ex = await rawExchange(h.sidecar.port, [chatThenGarbage(`x-test: ${mode}\r\nx-request-id: first-${mode}\r\n`)]);
    assert.equal(ex.responses.length, 2, `${mode}: ${ex.bytes.toString('latin1')}`);
    const [first, refusal] = ex.responses as [NonNullable<(typeof ex.responses)[0]>, NonNullable<(typeof ex.responses)[1]>];
    assert.equal(first.status, 200, mode);
    assert.equal(first.body.toString(), mode === 'json' ? REPLY : STREAM.join(''), `${mode}: the first answer whole, nothing inside it`);
    assert.equal(refusal.status, 400, mode);
    assert.equal(refusal.headers['x-keyward-error'], 'invalid_request');
    assert.equal(refusal.headers.connection, 'close');
    const line = await waitForLine(h, (l) => l.req_id === `first-${mode}`);
    assert.equal(line.status, 200, `${mode}: logged as answered, not as a client gone`);
  }
});

test('after Connection: close, refused bytes get no answer of their own', async () => {
  const ex = await rawExchange(h.sidecar.port, [chatThenGarbage('x-test: json\r\nConnection: close\r\nx-request-id: closing\r\n')]);
  assert.equal(ex.closed, true);
  assert.equal(ex.responses.length, 1, ex.bytes.toString('latin1'));
  assert.equal(ex.responses[0]!.status, 200);
  assert.equal(ex.responses[0]!.body.toString(), REPLY);
  assert.equal((await waitForLine(h, (l) => l.req_id === 'closing')).status, 200);
});
