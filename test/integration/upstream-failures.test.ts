/** Upstream failures answer in the route's style; metrics and shutdown behave. */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';
import { rawExchange } from '../helpers/raw.js';

describe('upstream failures', () => {
  let up: FakeUpstream;
  let h: Harness;
  let deadUrl: string;
  before(async () => {
    up = await startFakeUpstream((_req, _res) => {
      /* never answers: the sidecar's timeout must */
    });
    // a port that was listening and is now closed: connections are refused
    const tmp = http.createServer().listen(0, '127.0.0.1');
    await once(tmp, 'listening');
    deadUrl = `http://127.0.0.1:${(tmp.address() as { port: number }).port}`;
    await new Promise((r) => tmp.close(r));
    h = await startHarness({
      upstream: up.url,
      config: { upstreams: { default: { url: up.url, timeoutMs: 150 }, dead: { url: deadUrl } } },
      keys: { k_ok: {}, k_dead: { routing: 'dead' }, k_unknown_mode: { routing: 'nope' } },
    });
  });
  after(async () => {
    await h.close();
    await up.close();
  });

  test('an upstream that does not answer in time is 504 upstream_timeout', async () => {
    const res = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_ok!) });
    assert.equal(res.status, 504);
    assert.equal(res.headers['x-keyward-error'], 'upstream_timeout');
    assert.equal(res.json<{ error: { type: string } }>().error.type, 'api_error');
  });

  test('an unreachable upstream is 502 upstream_unavailable, in the messages style on messages routes', async () => {
    const res = await send(h.url, {
      method: 'POST', path: '/v1/messages',
      headers: { 'x-api-key': h.keys.k_dead!, 'content-type': 'application/json' },
      body: '{"model":"claude-3","max_tokens":1,"messages":[]}',
    });
    assert.equal(res.status, 502);
    assert.equal(res.headers['x-keyward-error'], 'upstream_unavailable');
    assert.deepEqual(Object.keys(res.json()), ['type', 'error']);
  });

  test('a request sent line by line (two Cookie lines) fails the same ways: 504 in time, 502 unreachable', async () => {
    const port = Number(new URL(h.url).port);
    const ask = async (key: string) => {
      const head = `GET /v1/files/file-1/content HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${key}\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n`;
      return (await rawExchange(port, [head], { expect: 1 })).responses[0]!;
    };
    const slow = await ask(h.keys.k_ok!);
    assert.deepEqual([slow.status, slow.headers['x-keyward-error']], [504, 'upstream_timeout']);
    const dead = await ask(h.keys.k_dead!);
    assert.deepEqual([dead.status, dead.headers['x-keyward-error']], [502, 'upstream_unavailable']);
  });

  test('an unknown routing mode goes to default and is logged', async () => {
    up.setHandler((_q, r) => {
      r.end('{}');
    });
    const res = await send(h.url, { path: '/v1/models', headers: bearer(h.keys.k_unknown_mode!) });
    assert.equal(res.status, 200);
    assert.ok(h.logs.some((l) => l.includes('routing mode names no upstream') && l.includes('"nope"')));
  });

  test('metrics count requests by route, status and code', async () => {
    const text = (await send(`http://127.0.0.1:${h.sidecar.adminPort}`, { path: '/metrics' })).body.toString();
    assert.match(text, /keyward_requests_total\{route="models",status="504",code="upstream_timeout"\} 1/);
    assert.match(text, /keyward_replica_version 1/);
    assert.match(text, /keyward_decision_seconds_bucket/);
    for (const key of Object.values(h.keys)) assert.ok(!text.includes(key));
  });
});

/** An upstream whose stream sends one event, then waits for `release` and ends with `last`; a sidecar in front, and a stream through it open. */
async function openStream(last: string) {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const up = await startFakeUpstream(async (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: 1\n\n');
    await gate;
    res.end(last);
  });
  const h = await startHarness({ upstream: up.url, keys: { k: {} } });
  const u = new URL(h.url);
  const req = http.request({ host: u.hostname, port: u.port, method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.k!), 'content-type': 'application/json' } });
  req.end('{"model":"m","stream":true}');
  const [res] = (await once(req, 'response')) as [http.IncomingMessage];
  await once(res, 'data');
  return { up, h, req, res, release };
}

describe('shutdown', () => {
  test('close() lets an in-flight stream finish, then stops accepting', async () => {
    const { up, h, res, release } = await openStream('data: [DONE]\n\n');
    // A failed assertion must not leave the stream open: the file would never end.
    try {
      const admin = `http://127.0.0.1:${h.sidecar.adminPort}`;
      const closing = h.sidecar.close({ graceMs: 5000 });
      assert.equal((await send(admin, { path: '/readyz' })).status, 503, 'draining is not ready');
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      release();
      await once(res, 'end');
      assert.match(Buffer.concat(chunks).toString(), /DONE/);
      await closing;
      await assert.rejects(send(h.url, { path: '/v1/models', headers: bearer(h.keys.k!) }));
    } finally {
      release();
      await h.sidecar.close({ graceMs: 0 });
      await h.replica.close();
      await up.close();
    }
  });

  test('a stream still in flight when the grace ends is cut by the sidecar: one shutdown line, no upstream failure', async () => {
    const { up, h, req, res, release } = await openStream('');
    try {
      // the sidecar cuts it: both ends of the client's call see the reset
      res.on('error', () => {});
      req.on('error', () => {});
      // not once(): it rejects on the 'error' that comes first
      const ended = new Promise((r) => res.on('close', r));
      await h.sidecar.close({ graceMs: 50 });
      await ended;
      const lines = h.logs.map((l) => JSON.parse(l) as Record<string, unknown>);
      const shutdown = lines.filter((l) => l.msg === 'shutdown grace over: cutting the requests still in flight');
      assert.equal(shutdown.length, 1);
      assert.equal(shutdown[0]!.in_flight, 1);
      assert.deepEqual(lines.filter((l) => l.msg === 'upstream failure'), [], 'the sidecar cut it, not the upstream');
      const access = lines.filter((l) => l.msg === 'request');
      assert.equal(access.length, 1, 'its access line is written');
      assert.equal(access[0]!.status, 200, 'with the status its head carried: the client did not go away');
      const cut = lines.filter((l) => l.msg === 'request cut at shutdown: the grace period ran out');
      assert.deepEqual(cut.map((l) => l.req_id), [access[0]!.req_id], 'a warning names the request cut');
    } finally {
      release();
      await h.replica.close();
      await up.close();
    }
  });

  test('draining with keep-alive clients: an answer not begun says close, an ended one lets its connection go at once', async () => {
    let releaseStream!: () => void;
    const streamGate = new Promise<void>((r) => (releaseStream = r));
    let releaseLate!: () => void;
    const lateGate = new Promise<void>((r) => (releaseLate = r));
    const up = await startFakeUpstream(async (req, res) => {
      if (req.headers['x-test-kind'] === 'late') await lateGate;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: 1\n\n');
      if (req.headers['x-test-kind'] === 'stream') await streamGate;
      res.end('data: [DONE]\n\n');
    });
    const h = await startHarness({ upstream: up.url, keys: { k: {} } });
    const agent = new http.Agent({ keepAlive: true });
    let closing: Promise<void> | null = null;
    try {
      const u = new URL(h.url);
      const open = (kind: string) => {
        const req = http.request({ host: u.hostname, port: u.port, method: 'POST', path: '/v1/chat/completions', agent, headers: { ...bearer(h.keys.k!), 'content-type': 'application/json', 'x-test-kind': kind } });
        req.end('{"model":"m","stream":true}');
        return req;
      };
      const stream = open('stream');
      const [streamRes] = (await once(stream, 'response')) as [http.IncomingMessage];
      assert.equal(streamRes.headers.connection, 'keep-alive', 'answered before the drain');
      const lateArrived = up.nextRequest();
      const late = open('late');
      const lateResponse = once(late, 'response') as Promise<[http.IncomingMessage]>;
      await lateArrived;
      closing = h.sidecar.close({ graceMs: 5000 });
      // The stream ends while the late request is still in flight: its connection is let go now,
      // not when the drain is over, so the client does not send another request on it meanwhile.
      const streamSocketClosed = once(stream.socket!, 'close');
      streamRes.resume();
      releaseStream();
      await once(streamRes, 'end');
      let timer!: NodeJS.Timeout;
      const closedInTime = await Promise.race([
        streamSocketClosed.then(() => true),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(false), 3000))),
      ]);
      clearTimeout(timer);
      assert.ok(closedInTime, 'the ended stream\'s connection stayed open while the drain went on');
      releaseLate();
      const [lateRes] = await lateResponse;
      assert.equal(lateRes.headers.connection, 'close', 'in flight at the drain, answered after it began');
      lateRes.resume();
      await once(lateRes, 'end');
    } finally {
      // a failed assertion must not leave the gates shut and the servers up
      releaseStream();
      releaseLate();
      agent.destroy();
      await (closing ?? h.sidecar.close({ graceMs: 0 }));
      await h.replica.close();
      await up.close();
    }
  });
});
