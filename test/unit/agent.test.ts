/**
 * The upstream agent is Node's own with documented hooks overridden: sockets go back to the
 * pool and come out of it as Node counts them, a busy socket that goes quiet fails its
 * request with UpstreamTimeout (one whose bytes keep coming does not), an idle one is
 * closed quietly, before the upstream's Keep-Alive hint runs out, and a reused one is
 * held to the upstream's timeout again, and bytes arriving on a socket kept alive get it
 * destroyed.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import https from 'node:https';
import { once } from 'node:events';
import net, { type AddressInfo, type Socket } from 'node:net';
import { createUpstreamAgent, noteKeepAlive } from '../../src/proxy/upstream/agent.js';

let server: http.Server;
let port: number;
/**
 * requests to /hang are never answered; /hint answers with a Keep-Alive hint of 2 s;
 * /trickle sends twenty bytes 50 ms apart
 */
before(async () => {
  server = http.createServer((req, res) => {
    req.resume();
    if (req.url === '/hang') return;
    if (req.url === '/hint') res.setHeader('keep-alive', 'timeout=2');
    if (req.url === '/trickle') return void trickle(res, 'abcdefghijklmnopqrst');
    req.on('end', () => res.end(`port ${port}`));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  port = (server.address() as AddressInfo).port;
});
after(() => {
  server.closeAllConnections();
  server.close();
});

function trickle(res: http.ServerResponse, text: string): void {
  res.writeHead(200, { 'content-length': text.length });
  let i = 0;
  const timer = setInterval(() => {
    res.write(text[i++]);
    if (i === text.length) {
      clearInterval(timer);
      res.end();
    }
  }, 50);
}

/** `keepAlive`: the response's Keep-Alive hint goes to the agent, as the forwarder sends it */
function get(agent: http.Agent, o: { to?: number; path?: string; keepAlive?: boolean } = {}): Promise<{ socket: Socket; reused: boolean; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: o.to ?? port, path: o.path ?? '/', agent }, (res) => {
      const hint = res.headers['keep-alive'];
      if (o.keepAlive) noteKeepAlive(res.socket, typeof hint === 'string' ? hint : null);
      const socket = req.socket as Socket;
      let body = '';
      res.setEncoding('latin1');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ socket, reused: req.reusedSocket, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** The socket goes back to the pool on the tick after a response ends. */
const settled = () => new Promise((r) => setImmediate(r));

describe('upstream agent', () => {
  test('sequential requests reuse one socket, and the pool counts it right', async () => {
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 60_000 });
    const name = `127.0.0.1:${port}:`;
    const a = await get(agent);
    await settled();
    const b = await get(agent);
    await settled();
    assert.equal(b.socket, a.socket);
    assert.equal(b.reused, true);
    assert.equal(agent.sockets[name], undefined, 'nothing in use');
    assert.equal(agent.freeSockets[name]?.length, 1);
    agent.destroy();
  });

  test('a busy socket quiet for longer than the timeout fails its request with UpstreamTimeout', async () => {
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 150 });
    const err = await get(agent, { path: '/hang' }).then(
      () => assert.fail('a request that is never answered must fail'),
      (e: Error & { code?: string }) => e,
    );
    assert.equal(err.code, 'UPSTREAM_TIMEOUT');
    assert.match(err.message, /within 150 ms/);
    agent.destroy();
  });

  test('an idle pooled socket past the timeout is closed quietly and leaves the pool', async () => {
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 150 });
    const name = `127.0.0.1:${port}:`;
    const a = await get(agent);
    await settled();
    assert.equal(agent.freeSockets[name]?.length, 1);
    let failed: Error | null = null;
    a.socket.on('error', (e) => (failed = e));
    await once(a.socket, 'close');
    assert.equal(failed, null, 'no error on an idle socket');
    assert.equal(name in agent.freeSockets, false);
    agent.destroy();
  });

  test("an idle socket is closed quietly before the upstream's Keep-Alive hint runs out", { timeout: 5_000 }, async () => {
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 60_000 });
    const name = `127.0.0.1:${port}:`;
    // hint 2 s: the idle limit is a second less (Node's margin) and two looks of the sweep less again
    const a = await get(agent, { path: '/hint', keepAlive: true });
    const idleFrom = performance.now();
    let failed: Error | null = null;
    a.socket.on('error', (e) => (failed = e));
    await once(a.socket, 'close');
    const idle = performance.now() - idleFrom;
    assert.ok(idle >= 400 && idle < 2_000, `closed after ${idle.toFixed(0)} ms idle`);
    assert.equal(failed, null, 'no error on an idle socket');
    assert.equal(name in agent.freeSockets, false);
    agent.destroy();
  });

  test("a reused socket is held to the upstream's timeout, not to the idle limit its hint set", async () => {
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 1_000 });
    const a = await get(agent, { path: '/hint', keepAlive: true });
    await settled();
    const req = http.request({ host: '127.0.0.1', port, path: '/hang', agent });
    const from = performance.now();
    req.end();
    const [socket] = (await once(req, 'socket')) as [Socket];
    assert.equal(socket, a.socket, 'the pooled socket was reused');
    const [err] = (await once(req, 'error')) as [Error & { code?: string }];
    const busy = performance.now() - from;
    assert.equal(err.code, 'UPSTREAM_TIMEOUT');
    // the hint's idle limit is 500 ms here
    assert.ok(busy >= 1_000, `timed out after ${busy.toFixed(0)} ms, before the upstream's 1,000`);
    agent.destroy();
  });

  test('a busy socket whose bytes keep coming is not timed out, however long the response takes', async () => {
    // the timeout is eight gaps long, so only a stall of that length could fail this test
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 400 });
    const started = performance.now();
    const got = await get(agent, { path: '/trickle' });
    assert.ok(performance.now() - started >= 900, 'the response took more than two timeouts');
    assert.equal(got.body, 'abcdefghijklmnopqrst');
    agent.destroy();
  });

  test('one agent calling two origins keeps a pool per origin, each request on its own origin', async () => {
    const other = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => res.end(`port ${otherPort}`));
    });
    other.listen(0, '127.0.0.1');
    await once(other, 'listening');
    const otherPort = (other.address() as AddressInfo).port;
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 60_000 });
    const bodies: string[] = [];
    for (const to of [port, otherPort, port, otherPort, port]) {
      bodies.push((await get(agent, { to })).body);
      await settled();
    }
    assert.deepEqual(bodies, [port, otherPort, port, otherPort, port].map((p) => `port ${p}`));
    assert.deepEqual(Object.keys(agent.freeSockets).sort(), [`127.0.0.1:${otherPort}:`, `127.0.0.1:${port}:`].sort());
    agent.destroy();
    other.closeAllConnections();
    other.close();
  });

  // Through the documented hooks alone (createConnection, keepSocketAlive), so Node's own
  // guard on free sockets, which its 'free' handler installs, is not in play: this is keyward's.
  test("bytes on a socket the agent keeps alive get it destroyed; a busy socket's bytes pass", { timeout: 5_000 }, async (t) => {
    const peers: Socket[] = [];
    const raw = net.createServer((s) => void peers.push(s));
    raw.listen(0, '127.0.0.1');
    await once(raw, 'listening');
    const rawPort = (raw.address() as AddressInfo).port;
    const agent = createUpstreamAgent({ tls: false, timeoutMs: 60_000 });
    // also when the test fails by its timeout, so that the file still ends
    t.after(() => {
      agent.destroy();
      for (const p of peers) p.destroy();
      raw.close();
    });
    const connect = async (): Promise<Socket> => {
      const socket = agent.createConnection({ host: '127.0.0.1', port: rawPort }) as Socket;
      await once(socket, 'connect');
      while (peers.length === 0 || peers.at(-1)!.remotePort !== socket.localPort) await new Promise((r) => setImmediate(r));
      return socket;
    };
    const busy = await connect();
    const got = once(busy, 'data');
    peers.at(-1)!.write('a response');
    assert.equal(String((await got)[0]), 'a response');
    assert.equal(busy.destroyed, false);

    const idle = await connect();
    assert.equal(agent.keepSocketAlive(idle), true);
    const closed = once(idle, 'close');
    peers.at(-1)!.write('HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale');
    await closed;
    assert.equal(idle.destroyed, true);
    busy.destroy();
  });

  test('an https upstream gets an https.Agent with the same hooks', () => {
    const agent = createUpstreamAgent({ tls: true, timeoutMs: 1_000 });
    assert.ok(agent instanceof https.Agent);
    assert.ok(Object.hasOwn(Object.getPrototypeOf(agent), 'reuseSocket'));
    agent.destroy();
  });
});
