/**
 * Accepted traffic reaches the upstream unchanged: method, target, headers (but the
 * hop-by-hop ones) and body bytes, for JSON, multipart, chunked and 100-continue
 * requests; SSE streams through chunk by chunk; a client abort reaches the upstream.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { Readable } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { sha256, type FakeUpstream } from '../helpers/upstream.js';
import { startBehindUpstream, waitForLine, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';

let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;

before(async () => {
  ({ up, h, close } = await startBehindUpstream({
    keys: { k_ok: {}, k_scoped: { models: ['whisper-*'] } },
  }));
});
after(() => close());

function multipart(boundary: string, parts: { name: string; value: Buffer | string; filename?: string }[]): Buffer {
  const chunks: Buffer[] = [];
  for (const p of parts) {
    const disp = `form-data; name="${p.name}"${p.filename ? `; filename="${p.filename}"` : ''}`;
    const type = p.filename ? 'content-type: application/octet-stream\r\n' : '';
    chunks.push(Buffer.from(`--${boundary}\r\ncontent-disposition: ${disp}\r\n${type}\r\n`), Buffer.from(p.value), Buffer.from('\r\n'));
  }
  chunks.push(Buffer.from(`--${boundary}--\r\n`));
  return Buffer.concat(chunks);
}

describe('forwarding', () => {
  test('a JSON model request arrives byte for byte with its headers, hop-by-hop ones dropped', async () => {
    const body = Buffer.from('{ "model" : "gpt-4o",\n "messages": [{"role":"user","content":"h\\u00e9llo"}], "max_tokens": 5 }');
    const res = await send(h.url, {
      method: 'POST',
      path: '/v1/chat/completions?trace=1',
      headers: {
        ...bearer(h.keys.k_ok!), 'content-type': 'application/json', 'x-custom': 'Keep-Me', 'x-app-name': 'tester',
        connection: 'keep-alive, x-hop', 'x-hop': 'drop me', 'keep-alive': 'timeout=5', te: 'trailers', 'proxy-authorization': 'Basic eA==',
      },
      body,
    });
    assert.equal(res.status, 200);
    const rec = up.received.at(-1)!;
    assert.equal(rec.method, 'POST');
    assert.equal(rec.url, '/v1/chat/completions?trace=1');
    assert.equal(rec.sha256, sha256(body));
    assert.equal(rec.headers['x-custom'], 'Keep-Me');
    assert.equal(rec.headers['x-app-name'], 'tester');
    assert.equal(rec.headers.authorization, `Bearer ${h.keys.k_ok}`);
    assert.equal(rec.headers['content-length'], String(body.length));
    for (const hop of ['x-hop', 'keep-alive', 'te', 'proxy-authorization']) assert.equal(rec.headers[hop], undefined, hop);
    const line = await waitForLine(h, (l) => l.path === '/v1/chat/completions' && l.status === 200);
    assert.equal(line.model, 'gpt-4o');
    assert.equal(res.headers['x-request-id'], line.req_id, 'the response names the id of its access-log line');
    assert.equal(rec.headers['x-request-id'], undefined, 'nothing is added to the forwarded request');
    assert.equal(line.app_name, 'tester');
  });

  test('a multipart upload with a binary file streams through with its boundary untouched', async () => {
    const file = randomBytes(300_000);
    const boundary = '----keyward-test-Boundary7MA4YWxkTrZu0gW';
    const body = multipart(boundary, [{ name: 'purpose', value: 'assistants' }, { name: 'file', value: file, filename: 'blob.bin' }]);
    const contentType = `multipart/form-data; boundary=${boundary}`;
    const res = await send(h.url, { method: 'POST', path: '/v1/files', headers: { ...bearer(h.keys.k_ok!), 'content-type': contentType }, body });
    assert.equal(res.status, 200);
    const rec = up.received.at(-1)!;
    assert.equal(rec.sha256, sha256(body));
    assert.equal(rec.headers['content-type'], contentType);
  });

  test('audio: the model form field before the file part is read and checked; the body is unchanged', async () => {
    const boundary = 'b0undary';
    const audio = randomBytes(100_000);
    const ok = multipart(boundary, [{ name: 'model', value: 'whisper-1' }, { name: 'file', value: audio, filename: 'a.wav' }]);
    const headers = { ...bearer(h.keys.k_scoped!), 'content-type': `multipart/form-data; boundary=${boundary}` };
    const res = await send(h.url, { method: 'POST', path: '/v1/audio/transcriptions', headers, body: ok });
    assert.equal(res.status, 200);
    assert.equal(up.received.at(-1)!.sha256, sha256(ok));
    const line = await waitForLine(h, (l) => l.path === '/v1/audio/transcriptions' && l.status === 200);
    assert.equal(line.model, 'whisper-1');

    const count = up.received.length;
    const wrong = multipart(boundary, [{ name: 'model', value: 'gpt-4o-transcribe' }, { name: 'file', value: audio, filename: 'a.wav' }]);
    const denied = await send(h.url, { method: 'POST', path: '/v1/audio/transcriptions', headers, body: wrong });
    assert.equal(denied.status, 403);
    assert.equal(denied.json<{ error: { code: string } }>().error.code, 'model_not_allowed');
    const late = multipart(boundary, [{ name: 'file', value: audio, filename: 'a.wav' }, { name: 'model', value: 'whisper-1' }]);
    const lateRes = await send(h.url, { method: 'POST', path: '/v1/audio/transcriptions', headers, body: late });
    assert.equal(lateRes.status, 403, 'a model field after the file part is not read; a scoped key must name it first');
    assert.equal(up.received.length, count);
  });

  test('audio: a second model field after the file part is refused, small or streamed, and the upstream never gets the whole body', async () => {
    const boundary = 'late-boundary';
    const headers = { ...bearer(h.keys.k_scoped!), 'content-type': `multipart/form-data; boundary=${boundary}` };
    for (const size of [1000, 3_000_000]) {
      const sneaky = multipart(boundary, [{ name: 'model', value: 'whisper-1' }, { name: 'file', value: randomBytes(size), filename: 'a.wav' }, { name: 'model', value: 'gpt-4o-transcribe' }]);
      const count = up.received.length;
      const res = await send(h.url, { method: 'POST', path: '/v1/audio/transcriptions', headers, body: sneaky });
      assert.equal(res.status, 400, `size ${size}`);
      assert.equal(res.headers['x-keyward-error'], 'invalid_request');
      assert.match(res.json<{ error: { message: string } }>().error.message, /after the file part/);
      assert.equal(up.received.length, count, 'the upstream received a complete body');
    }
  });

  test('a chunked request body arrives byte-identical', async () => {
    const parts = [Buffer.from('{"model":"gpt-4o","mess'), Buffer.from('ages":[{"role":"user","content":"'), randomBytes(5000).toString('hex'), Buffer.from('"}]}')];
    const whole = Buffer.concat(parts.map((p) => Buffer.from(p)));
    const res = await send(h.url, {
      method: 'POST', path: '/v1/chat/completions',
      headers: { ...bearer(h.keys.k_ok!), 'content-type': 'application/json', 'transfer-encoding': 'chunked' },
      body: Readable.from(parts.map((p) => Buffer.from(p))),
    });
    assert.equal(res.status, 200);
    const rec = up.received.at(-1)!;
    assert.equal(rec.sha256, sha256(whole));
    assert.equal(rec.headers['transfer-encoding'], 'chunked');
  });

  test('Expect: 100-continue: accepted requests get 100 and arrive byte-identical; denied ones get the denial instead', async () => {
    const body = Buffer.from(JSON.stringify({ model: 'gpt-4o', input: 'x'.repeat(10_000) }));
    const run = (key: string) =>
      new Promise<{ status: number; continued: boolean }>((resolve, reject) => {
        const u = new URL(h.url);
        const req = http.request({
          host: u.hostname, port: u.port, method: 'POST', path: '/v1/responses',
          headers: { ...bearer(key), 'content-type': 'application/json', 'content-length': body.length, expect: '100-continue' },
        });
        let continued = false;
        req.on('continue', () => {
          continued = true;
          req.end(body);
        });
        req.on('response', (res) => {
          res.resume();
          res.on('end', () => resolve({ status: res.statusCode ?? 0, continued }));
          if (!continued) req.destroy();
        });
        req.on('error', (e) => (continued ? reject(e) : undefined));
        req.flushHeaders();
      });
    const before = up.received.length;
    const denied = await run('not-a-key');
    assert.deepEqual(denied, { status: 401, continued: false });
    assert.equal(up.received.length, before);
    const ok = await run(h.keys.k_ok!);
    assert.deepEqual(ok, { status: 200, continued: true });
    assert.equal(up.received.at(-1)!.sha256, sha256(body));
  });

  for (const cookies of [0, 2]) {
    const lines = cookies === 0 ? '' : `, two Cookie lines (sent line by line)`;
    /** The request's head as Node's documented array of lines (Node adds no Host to one), with `cookies` Cookie lines. */
    const head = () => ['host', new URL(h.url).host, 'authorization', `Bearer ${h.keys.k_ok!}`, 'content-type', 'application/json', ...Array.from({ length: cookies }, (_, i) => ['cookie', `c${i}=1`]).flat()];

    test(`an SSE response's first event reaches the client before the upstream has finished${lines}`, async () => {
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      up.setHandler(async (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"delta":{"content":"first"}}]}\n\n');
        await released; // only the client seeing the first event lets the upstream finish
        res.end('data: [DONE]\n\n');
      });
      try {
        const u = new URL(h.url);
        const req = http.request({ host: u.hostname, port: u.port, method: 'POST', path: '/v1/chat/completions', headers: head() });
        req.end('{"model":"gpt-4o","stream":true}');
        const [res] = (await once(req, 'response')) as [http.IncomingMessage];
        const [first] = (await once(res, 'data')) as [Buffer];
        assert.match(first.toString(), /"first"/);
        release();
        const rest: Buffer[] = [];
        res.on('data', (c: Buffer) => rest.push(c));
        await once(res, 'end');
        assert.match(Buffer.concat(rest).toString(), /\[DONE\]/);
      } finally {
        up.setHandler((_q, r, rec) => {
          r.end(JSON.stringify({ ok: true, sha256: rec.sha256 }));
        });
      }
    });

    test(`a client that goes away closes the upstream request${lines}`, async () => {
      up.setHandler((_req, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {}\n\n'); // and never ends
      });
      try {
        const arrived = up.nextRequest();
        const u = new URL(h.url);
        const req = http.request({ host: u.hostname, port: u.port, method: 'POST', path: '/v1/chat/completions', headers: head() });
        req.on('error', () => {});
        req.end('{"model":"gpt-4o","stream":true}');
        const [res] = (await once(req, 'response')) as [http.IncomingMessage];
        await once(res, 'data');
        const rec = await arrived;
        req.destroy();
        assert.equal(await rec.closed, 'aborted');
        const line = await waitForLine(h, (l) => l.status === 499);
        assert.equal(line.key_id, 'k_ok');
      } finally {
        up.setHandler((_q, r, rec) => {
          r.end(JSON.stringify({ ok: true, sha256: rec.sha256 }));
        });
      }
    });
  }

  // DESIGN section 4: X-APP-NAME and X-APP-URL are logged trimmed, at most 256 characters
  // (never cut inside a surrogate pair), and forwarded unchanged.
  test('attribution over 256 characters is logged cut to 256 and forwarded whole', async () => {
    const name = `  ${'n'.repeat(300)}  `;
    const url = `https://example.test/${'u'.repeat(400)}`;
    const r = await send(h.url, { path: '/v1/models', headers: { ...bearer(h.keys.k_ok!), 'x-app-name': name, 'x-app-url': url } });
    assert.equal(r.status, 200);
    const line = await waitForLine(h, (l) => l.req_id === r.headers['x-request-id']);
    assert.equal(line.app_name, 'n'.repeat(256));
    assert.equal(line.app_url, url.slice(0, 256));
    const rec = up.received.at(-1)!;
    assert.equal(rec.headers['x-app-name'], name.trim(), 'forwarded as sent (Node trims the value it parses)');
    assert.equal(rec.headers['x-app-url'], url);
  });

  test('attribution of exactly 256 characters is logged whole; a pair across the cut is left out whole', async () => {
    const exact = 'e'.repeat(256);
    let r = await send(h.url, { path: '/v1/models', headers: { ...bearer(h.keys.k_ok!), 'x-app-name': exact } });
    let line = await waitForLine(h, (l) => l.req_id === r.headers['x-request-id']);
    assert.equal(line.app_name, exact);
    // 255 characters, then an emoji (a surrogate pair) that a cut at 256 would split; sent as UTF-8 bytes
    const pair = Buffer.from(`${'p'.repeat(255)}\u{1F600}tail`, 'utf8').toString('latin1');
    r = await send(h.url, { path: '/v1/models', headers: { ...bearer(h.keys.k_ok!), 'x-app-name': pair } });
    line = await waitForLine(h, (l) => l.req_id === r.headers['x-request-id']);
    assert.equal(line.app_name, 'p'.repeat(255));
  });

  test('no key and no key hash ever reaches a log line', async () => {
    const { makeKeyHasher } = await import('../../src/auth/hash.js');
    const hash = makeKeyHasher({ hash: 'sha256' });
    await send(h.url, { path: '/v1/models', headers: bearer('sk-ant-api03-secretvalue-should-not-appear') });
    await waitForLine(h, (l) => l.code === 'invalid_api_key');
    const text = h.logs.join('\n');
    for (const key of [...Object.values(h.keys), 'sk-ant-api03-secretvalue-should-not-appear']) {
      assert.ok(!text.includes(key), 'a key appeared in the logs');
      assert.ok(!text.includes(hash(key)), 'a key hash appeared in the logs');
      assert.ok(!text.includes(key.slice(0, 12)), 'a key prefix appeared in the logs');
    }
  });
});
