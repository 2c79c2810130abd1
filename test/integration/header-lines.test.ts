/**
 * Header lines reach the upstream as received (DESIGN section 5, "Headers"): a repeated
 * header stays as separate lines with its values in order, never joined or dropped, on
 * every route class and framing; hop-by-hop lines and those Connection names go. The
 * fake upstream records the raw lines it read.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FakeUpstream } from '../helpers/upstream.js';
import { startBehindUpstream, startHarness, type Harness } from '../helpers/sidecar.js';
import { chunked, rawExchange } from '../helpers/raw.js';

let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;
let port: number;

before(async () => {
  ({ up, h, close } = await startBehindUpstream({ keys: { k_ok: {} } }));
  port = Number(new URL(h.url).port);
});
after(() => close());

/** The raw lines the upstream read, as [name, value] pairs in order (names as sent). */
function linesOf(raw: string[]): [string, string][] {
  const out: [string, string][] = [];
  for (let i = 0; i < raw.length; i += 2) out.push([raw[i]!, raw[i + 1]!]);
  return out;
}

/** The lines named `name` (any case), in order. */
const named = (raw: string[], name: string) => linesOf(raw).filter(([n]) => n.toLowerCase() === name);

async function exchange(head: string, body: Buffer | string = ''): Promise<number> {
  const before = up.received.length;
  const ex = await rawExchange(port, [head, body], { expect: 1 });
  assert.equal(up.received.length, before + 1, `forwarded: ${ex.bytes.toString('latin1').slice(0, 200)}`);
  return ex.responses[0]!.status;
}

describe('header lines', () => {
  const repeated = [
    ['X-Trace', 'one'], ['x-trace', 'two, three'], ['X-TRACE', 'four'],
    // Node's header object keeps only the first of these
    ['User-Agent', 'first/1'], ['user-agent', 'second/2'],
    ['Accept', 'application/json'], ['Accept', 'text/event-stream'],
    ['X-Forwarded-For', '10.0.0.1'], ['X-Forwarded-For', '10.0.0.2'],
  ];
  const block = repeated.map(([n, v]) => `${n}: ${v}\r\n`).join('');

  test('a repeated header reaches the upstream as separate lines in order, on a model route', async () => {
    const body = '{"model":"gpt-4o","messages":[]}';
    const status = await exchange(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${block}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`,
      body,
    );
    assert.equal(status, 200);
    const raw = up.received.at(-1)!.rawHeaders;
    assert.deepEqual(named(raw, 'x-trace').map(([, v]) => v), ['one', 'two, three', 'four']);
    assert.deepEqual(named(raw, 'user-agent').map(([, v]) => v), ['first/1', 'second/2']);
    assert.deepEqual(named(raw, 'accept').map(([, v]) => v), ['application/json', 'text/event-stream']);
    assert.deepEqual(named(raw, 'x-forwarded-for').map(([, v]) => v), ['10.0.0.1', '10.0.0.2']);
    // the lines of one name keep their place among the others: first seen, first sent
    const order = [...new Set(linesOf(raw).map(([n]) => n.toLowerCase()))];
    assert.ok(order.indexOf('x-trace') < order.indexOf('user-agent') && order.indexOf('user-agent') < order.indexOf('accept'), order.join(','));
  });

  test('a repeated header on a bodiless listing call and on a chunked files upload', async () => {
    assert.equal(await exchange(`GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${block}\r\n`), 200);
    assert.deepEqual(named(up.received.at(-1)!.rawHeaders, 'x-trace').map(([, v]) => v), ['one', 'two, three', 'four']);
    const status = await exchange(
      `POST /v1/files HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${block}Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n`,
      chunked('file bytes'),
    );
    assert.equal(status, 200);
    const rec = up.received.at(-1)!;
    assert.deepEqual(named(rec.rawHeaders, 'user-agent').map(([, v]) => v), ['first/1', 'second/2']);
    assert.deepEqual(named(rec.rawHeaders, 'transfer-encoding').map(([, v]) => v), ['chunked']);
    assert.equal(rec.body.toString(), 'file bytes');
  });

  test('repeated cookie lines stay separate lines in order, with every other line and the body unchanged', async () => {
    assert.equal(await exchange(`GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nCookie: a=1\r\nCookie: b=2; c=3\r\n\r\n`), 200);
    assert.deepEqual(named(up.received.at(-1)!.rawHeaders, 'cookie').map(([, v]) => v), ['a=1', 'b=2; c=3']);

    const body = '{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}';
    const status = await exchange(
      `POST /v1/chat/completions?v=1 HTTP/1.1\r\nHost: a\r\nCookie: s=1\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${block}cookie: t=2\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`,
      body,
    );
    assert.equal(status, 200);
    const rec = up.received.at(-1)!;
    assert.equal(rec.url, '/v1/chat/completions?v=1');
    assert.equal(rec.body.toString(), body);
    assert.deepEqual(named(rec.rawHeaders, 'cookie').map(([, v]) => v), ['s=1', 't=2']);
    assert.deepEqual(named(rec.rawHeaders, 'host').map(([, v]) => v), ['a']);
    assert.deepEqual(named(rec.rawHeaders, 'x-trace').map(([, v]) => v), ['one', 'two, three', 'four']);
    assert.deepEqual(named(rec.rawHeaders, 'user-agent').map(([, v]) => v), ['first/1', 'second/2']);
    assert.deepEqual(named(rec.rawHeaders, 'content-length').map(([, v]) => v), [String(body.length)]);
  });

  test('a request received without framing goes out with content-length 0, whether or not it repeats Cookie', async () => {
    for (const cookies of ['', 'Cookie: a=1\r\nCookie: b=2\r\n']) {
      assert.equal(await exchange(`POST /v1/files HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${cookies}\r\n`), 200);
      const rec = up.received.at(-1)!;
      assert.deepEqual(named(rec.rawHeaders, 'transfer-encoding'), [], cookies ? 'sent line by line' : 'sent by the stream pass');
      assert.deepEqual(named(rec.rawHeaders, 'content-length').map(([, v]) => v), ['0']);
      assert.equal(rec.body.length, 0);
    }
  });

  test('hop-by-hop lines and every name a Connection line lists are dropped; the rest stay', async () => {
    assert.equal(
      await exchange(
        `GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nConnection: x-one\r\nConnection: keep-alive, x-two\r\nX-One: 1\r\nX-Two: 2\r\nX-Two: 2b\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eA==\r\nX-Kept: yes\r\nX-Kept: again\r\n\r\n`,
      ),
      200,
    );
    const raw = up.received.at(-1)!.rawHeaders;
    for (const gone of ['x-one', 'x-two', 'keep-alive', 'te', 'proxy-authorization']) assert.deepEqual(named(raw, gone), [], gone);
    assert.deepEqual(named(raw, 'x-kept').map(([, v]) => v), ['yes', 'again']);
  });

  // Keep-Alive and TE are hop-by-hop by their names (RFC 9110 section 7.6.1): they go even
  // when no Connection line lists them, or when one lists only other names.
  for (const connection of ['', 'Connection: close\r\n', 'Connection: x-other\r\n']) {
    test(`Keep-Alive and TE lines are dropped with ${connection ? connection.trim() : 'no Connection line'}`, async () => {
      const extra = 'Keep-Alive: timeout=600, max=1000\r\nTE: trailers\r\nX-Kept: yes\r\n';
      assert.equal(await exchange(`GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n${connection}${extra}\r\n`), 200);
      const raw = up.received.at(-1)!.rawHeaders;
      assert.deepEqual(named(raw, 'keep-alive'), [], 'keep-alive belongs to the client connection');
      assert.deepEqual(named(raw, 'te'), []);
      assert.deepEqual(named(raw, 'x-kept').map(([, v]) => v), ['yes']);
    });
  }

  test('a Connection line naming the credential keyward checked does not take it away from the upstream', async () => {
    // else the upstream would get no credential, or only one keyward never read (x-api-key on a Bearer route)
    assert.equal(await exchange(`GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: Authorization, x-one\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nX-One: 1\r\n\r\n`), 200);
    let raw = up.received.at(-1)!.rawHeaders;
    assert.deepEqual(named(raw, 'authorization').map(([, v]) => v), [`Bearer ${h.keys.k_ok}`]);
    assert.deepEqual(named(raw, 'x-one'), []);
    const body = '{"model":"claude-x","max_tokens":5,"messages":[]}';
    const status = await exchange(
      `POST /v1/messages HTTP/1.1\r\nHost: a\r\nConnection: x-api-key\r\nx-api-key: ${h.keys.k_ok}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`,
      body,
    );
    assert.equal(status, 200);
    raw = up.received.at(-1)!.rawHeaders;
    assert.deepEqual(named(raw, 'x-api-key').map(([, v]) => v), [h.keys.k_ok]);
  });

  test('a header named like an object property is an ordinary header', async () => {
    assert.equal(await exchange(`GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok}\r\n__proto__: x\r\nconstructor: y\r\n__proto__: w\r\nconstructor: z\r\ntoString: t\r\n\r\n`), 200);
    const raw = up.received.at(-1)!.rawHeaders;
    assert.deepEqual(named(raw, '__proto__').map(([, v]) => v), ['x', 'w']);
    assert.deepEqual(named(raw, 'constructor').map(([, v]) => v), ['y', 'z']);
    assert.deepEqual(named(raw, 'tostring').map(([, v]) => v), ['t']);
  });
});

describe('header lines, upstream under a path', () => {
  let based: Harness;
  let basedPort: number;
  before(async () => {
    based = await startHarness({ upstream: `${up.url}/base/?tenant=1`, keys: { k_ok: {} } });
    basedPort = Number(new URL(based.url).port);
  });
  after(() => based.close());

  /** The path and query the upstream read for `target`, with `cookies` Cookie lines. */
  async function pathFor(target: string, cookies: number): Promise<string> {
    const lines = Array.from({ length: cookies }, (_, i) => `Cookie: c${i}=1\r\n`).join('');
    const n = up.received.length;
    const ex = await rawExchange(basedPort, [`GET ${target} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${based.keys.k_ok}\r\n${lines}\r\n`], { expect: 1 });
    assert.equal(ex.responses[0]!.status, 200);
    assert.equal(up.received.length, n + 1);
    assert.equal(named(up.received.at(-1)!.rawHeaders, 'cookie').length, cookies);
    return up.received.at(-1)!.url;
  }

  test('a request sent line by line goes to the path the one-line request goes to', async () => {
    for (const target of ['/v1/models', '/v1/models?x=1&y=2', '/v1/models/gpt-4o', '/v1/files/file-1/content?a=%20b']) {
      const one = await pathFor(target, 1);
      assert.equal(await pathFor(target, 2), one, target);
    }
    assert.equal(await pathFor('/v1/models?x=1', 2), '/base/v1/models?tenant=1&x=1');
  });
});
