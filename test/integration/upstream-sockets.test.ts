/**
 * Upstream keep-alive hygiene: a pooled upstream socket that sends bytes for a request
 * it was not sent (a stray or doubled response) is destroyed, never handed to the next
 * request, whose client would otherwise read someone else's response.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';
import { rawExchange } from '../helpers/raw.js';
import { IDLE_MAX_MS } from '../../src/proxy/upstream/agent.js';

interface RawUpstream {
  port: number;
  sockets: net.Socket[];
  /** what to write for each request: called with the socket and the request count on it */
  onRequest: (socket: net.Socket, n: number) => void;
  nextSocket(): Promise<net.Socket>;
  close(): Promise<void>;
}

async function rawUpstream(): Promise<RawUpstream> {
  const waiters: ((s: net.Socket) => void)[] = [];
  const up: RawUpstream = {
    port: 0,
    sockets: [],
    onRequest: () => {},
    nextSocket: () => new Promise((r) => waiters.push(r)),
    close: () => new Promise((r) => server.close(() => r())),
  };
  const server = net.createServer((socket) => {
    up.sockets.push(socket);
    waiters.shift()?.(socket);
    let buf = '';
    let n = 0;
    socket.on('data', (c: Buffer) => {
      buf += c.toString('latin1');
      for (let i = buf.indexOf('\r\n\r\n'); i !== -1; i = buf.indexOf('\r\n\r\n')) {
        buf = buf.slice(i + 4);
        up.onRequest(socket, ++n);
      }
    });
    socket.on('error', () => {});
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  up.port = (server.address() as net.AddressInfo).port;
  return up;
}

const response = (body: string, extra = '') => `HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n${extra}content-length: ${body.length}\r\n\r\n${body}`;

let up: RawUpstream;
let h: Harness;

before(async () => {
  up = await rawUpstream();
  h = await startHarness({ upstream: `http://127.0.0.1:${up.port}`, keys: { k_ok: {}, k_one: { concurrency: 1 } } });
});
after(async () => {
  await h.close();
  for (const s of up.sockets) s.destroy();
  await up.close();
});

describe('upstream socket hygiene', () => {
  test('bytes arriving on an idle pooled socket get it destroyed', { timeout: 10_000 }, async () => {
    up.onRequest = (s) => s.write(response('first'));
    const connected = up.nextSocket();
    const r1 = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.equal(r1.body.toString(), 'first');
    const socket = await connected;
    const closed = once(socket, 'close');
    socket.write(response('stale')); // a response to a request this socket was never sent
    await closed;
    up.onRequest = (s) => s.write(response('fresh'));
    const r2 = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.equal(r2.body.toString(), 'fresh');
  });

  test('a doubled response in one write never answers the next request', { timeout: 10_000 }, async () => {
    const count = up.sockets.length;
    up.onRequest = (s) => s.write(response('one') + response('two'));
    const r1 = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.equal(r1.body.toString(), 'one');
    up.onRequest = (s) => s.write(response('fresh'));
    const r2 = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.equal(r2.body.toString(), 'fresh');
    assert.ok(up.sockets.length > count);
  });
});

describe('bytes past the end of a whole answer', () => {
  for (const [name, write, status, body] of [
    ['a body longer than its content-length', `HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nokEXTRA`, 200, 'ok'],
    ['a 204 with a body', `HTTP/1.1 204 No Content\r\ncontent-length: 2\r\n\r\nok`, 204, ''],
  ] as const) {
    test(`${name}: the answer goes out whole, the socket is dropped, and a warning says so`, { timeout: 10_000 }, async () => {
      up.onRequest = (s) => s.write(write);
      const warned = h.logs.length;
      const r = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
      assert.deepEqual([r.status, r.body.toString()], [status, body], 'not a silent close');
      up.onRequest = (s) => s.write(response('fresh'));
      assert.equal((await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) })).body.toString(), 'fresh');
      const logged = await waitForLine(h, (l) => l.req_id === r.headers['x-request-id']);
      assert.equal(logged.status, status);
      const lines = h.logs.slice(warned).map((l) => JSON.parse(l) as Record<string, unknown>);
      assert.ok(lines.some((l) => l.msg === 'upstream failure after a whole response; it went out whole' && l.req_id === logged.req_id), h.logs.slice(warned).join('\n'));
    });
  }
});

describe('upstream socket pool', () => {
  const models = () => send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });

  test('requests one after another all go over one pooled socket', { timeout: 10_000 }, async () => {
    const seen: net.Socket[] = [];
    up.onRequest = (s, n) => {
      seen.push(s);
      s.write(response(`r${n}`));
    };
    const bodies: string[] = [];
    for (let i = 0; i < 5; i++) bodies.push((await models()).body.toString());
    assert.equal(new Set(seen).size, 1);
    // the socket's own request count goes up by one per request: each was sent once
    const first = Number(bodies[0]!.slice(1));
    assert.deepEqual(bodies, [0, 1, 2, 3, 4].map((i) => `r${first + i}`));
  });

  test('a wave of concurrent requests opens one socket each, and the next wave reuses them all', { timeout: 10_000 }, async () => {
    const wave = async () => {
      // answer only when all four have arrived, so none can wait for another's socket
      const waiting: net.Socket[] = [];
      up.onRequest = (s) => {
        waiting.push(s);
        if (waiting.length === 4) for (const w of waiting) w.write(response('ok'));
      };
      const rs = await Promise.all([models(), models(), models(), models()]);
      assert.deepEqual(rs.map((r) => r.body.toString()), ['ok', 'ok', 'ok', 'ok']);
      return new Set(waiting);
    };
    const a = await wave();
    const opened = up.sockets.length;
    const b = await wave();
    assert.equal(a.size, 4);
    assert.deepEqual([...b].sort((x, y) => up.sockets.indexOf(x) - up.sockets.indexOf(y)), [...a].sort((x, y) => up.sockets.indexOf(x) - up.sockets.indexOf(y)));
    assert.equal(up.sockets.length, opened);
  });

  test('a socket whose Keep-Alive timeout is too short to reuse is closed, not pooled', { timeout: 10_000 }, async () => {
    // Node's pool keeps a one-second margin before the server's announced timeout: 1 s leaves none
    let socket: net.Socket | null = null;
    up.onRequest = (s) => {
      socket = s;
      s.write(response('short', 'Keep-Alive: timeout=1\r\n'));
    };
    const r1 = await models();
    assert.equal(r1.body.toString(), 'short');
    const used = socket as net.Socket | null;
    assert.ok(used);
    // kept in the pool, it would stay open until the agent's own idle timeout (minutes)
    if (!used.destroyed) await once(used, 'close');
    let next: net.Socket | null = null;
    up.onRequest = (s) => {
      next = s;
      s.write(response('next'));
    };
    assert.equal((await models()).body.toString(), 'next');
    assert.notEqual(next, used);
  });

  test("a pooled socket is closed before the upstream's Keep-Alive hint runs out", { timeout: 10_000 }, async () => {
    // this upstream never closes an idle socket itself: only the sidecar can, and within the hint
    let socket: net.Socket | null = null;
    up.onRequest = (s) => {
      socket = s;
      s.write(response('hinted', 'Keep-Alive: timeout=2\r\n'));
    };
    assert.equal((await models()).body.toString(), 'hinted');
    const from = performance.now();
    const used = socket as net.Socket | null;
    assert.ok(used);
    if (!used.destroyed) await once(used, 'close');
    const idle = performance.now() - from;
    assert.ok(idle < 2_000, `closed after ${idle.toFixed(0)} ms idle`);
  });
});

describe('upstream answers that are no answer', () => {
  const SWITCH = 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n';

  test('a 101 to a request that asked for no upgrade is 502 at once, and the request\'s slot is free again', { timeout: 10_000 }, async () => {
    up.onRequest = (s) => s.write(SWITCH);
    const started = performance.now();
    const r = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_one!) });
    assert.deepEqual([r.status, r.headers['x-keyward-error']], [502, 'upstream_unavailable']);
    assert.ok(performance.now() - started < 2_000, 'not left to the upstream timeout (10 minutes)');
    up.onRequest = (s) => s.write(response('after'));
    const next = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_one!) });
    assert.deepEqual([next.status, next.body.toString()], [200, 'after'], 'concurrency 1: the first request ended');
  });

  test('the same on the line-by-line path (two Cookie lines, no body) and with a body', { timeout: 10_000 }, async () => {
    up.onRequest = (s) => s.write(SWITCH);
    const port = Number(new URL(h.url).port);
    const head = `GET /v1/files/file-1/content HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${h.keys.k_ok!}\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n`;
    const lines = (await rawExchange(port, [head], { expect: 1 })).responses[0]!;
    assert.deepEqual([lines.status, lines.headers['x-keyward-error']], [502, 'upstream_unavailable']);
    const posted = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.k_ok!), 'content-type': 'application/json' }, body: '{"model":"gpt-4o","messages":[]}' });
    assert.deepEqual([posted.status, posted.headers['x-keyward-error']], [502, 'upstream_unavailable']);
  });

  test('a response whose transfer coding is more than chunked (gzip, chunked) is 502, not coded bytes no header names', { timeout: 10_000 }, async () => {
    up.onRequest = (s) => s.write('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n');
    const r = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.deepEqual([r.status, r.headers['x-keyward-error']], [502, 'upstream_unavailable']);
    up.onRequest = (s) => s.write('HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n');
    const plain = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.deepEqual([plain.status, plain.body.toString()], [200, 'ok'], 'chunked alone, any case, is relayed');
  });

  test(`an idle pooled socket is closed within ${IDLE_MAX_MS} ms without a Keep-Alive hint (servers that close at 5 s say nothing)`, { timeout: 10_000 }, async () => {
    let socket: net.Socket | null = null;
    up.onRequest = (s) => {
      socket = s;
      s.write(response('unhinted'));
    };
    assert.equal((await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) })).body.toString(), 'unhinted');
    const from = performance.now();
    const used = socket as net.Socket | null;
    assert.ok(used);
    if (!used.destroyed) await once(used, 'close');
    const idle = performance.now() - from;
    // What it must beat is the server's own close at 5 s; a stalled machine may read past IDLE_MAX_MS.
    assert.ok(idle < 5_000, `closed after ${idle.toFixed(0)} ms idle (IDLE_MAX_MS ${IDLE_MAX_MS})`);
  });
});

describe('parser refusals after a response began', () => {
  test('a malformed chunk after the upstream already answered closes the connection without a second response', { timeout: 10_000 }, async () => {
    up.onRequest = (s) => s.write(response('early'));
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    await once(socket, 'connect');
    const chunks: Buffer[] = [];
    const closed = once(socket, 'close');
    const first = new Promise<void>((resolve) => {
      socket.on('data', (c: Buffer) => {
        chunks.push(c);
        if (Buffer.concat(chunks).includes('early')) resolve();
      });
    });
    socket.write(`POST /v1/files HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_ok}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n`);
    await first;
    socket.write('zz\r\nbad\r\n');
    await closed;
    const text = Buffer.concat(chunks).toString('latin1');
    assert.equal(text.match(/HTTP\/1\.1 /g)?.length, 1, text);
  });
});
