/**
 * The upstream agent's trimmed steps keep Node's pool bookkeeping exact: a reused socket
 * is counted in use while it serves and back in the free list after, the free list's
 * entry goes when it empties, a reused socket reports a new async id, and the Keep-Alive
 * hint is read from the raw lines as Node reads it from the header object.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { keepAliveHint, leanAgent } from '../../src/proxy/agent.js';

type Pool = http.Agent & { freeSockets: Record<string, unknown[]>; sockets: Record<string, unknown[]>; requests: Record<string, unknown[]>; totalSocketCount: number };

let server: http.Server;
let port: number;
before(async () => {
  server = http.createServer((req, res) => {
    req.resume();
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

function get(agent: http.Agent, to = port): Promise<{ socket: import('node:net').Socket; asyncId: number; reused: boolean; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: to, path: '/', agent }, (res) => {
      const socket = req.socket!;
      // Node's own id field, set for the request the socket carries now
      const sym = Object.getOwnPropertySymbols(socket).find((s) => s.description === 'async_id_symbol')!;
      const asyncId = (socket as unknown as Record<symbol, number>)[sym]!;
      let body = '';
      res.setEncoding('latin1');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ socket, asyncId, reused: (req as { reusedSocket?: boolean }).reusedSocket === true, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** The 'free' event runs on the tick after a response ends. */
const settled = () => new Promise((r) => setImmediate(r));

/** A lean agent that has served one request, its socket back in the pool by now. */
async function servedOnce(opts: http.AgentOptions = { keepAlive: true }) {
  const agent = leanAgent(new http.Agent(opts), { tls: false }) as Pool;
  const first = await get(agent);
  await settled();
  return { agent, name: `127.0.0.1:${port}:`, first };
}

describe('lean upstream agent', () => {
  test('sequential requests reuse one socket, with a new async id each time, and the pool counts it right', async () => {
    const { agent, name, first: a } = await servedOnce({ keepAlive: true, scheduling: 'lifo' });
    const b = await get(agent);
    await settled();
    assert.equal(b.socket, a.socket);
    assert.equal(b.reused, true);
    assert.notEqual(b.asyncId, a.asyncId);
    assert.ok(b.asyncId > 0);
    assert.equal(agent.totalSocketCount, 1);
    assert.equal(agent.sockets[name], undefined, 'nothing in use');
    assert.equal(agent.freeSockets[name]?.length, 1);
    agent.destroy();
  });

  test('a socket in use is counted in use; the free list entry goes while it is empty', async () => {
    const { agent, name } = await servedOnce({ keepAlive: true, scheduling: 'lifo' });
    const req = http.request({ host: '127.0.0.1', port, path: '/', agent });
    const responded = once(req, 'response');
    req.end();
    // handed the pooled socket at once, inside request()
    assert.equal(agent.sockets[name]?.length, 1);
    assert.equal(name in agent.freeSockets, false);
    const [res] = (await responded) as [http.IncomingMessage];
    res.resume();
    await once(res, 'end');
    await settled();
    assert.equal(agent.freeSockets[name]?.length, 1);
    assert.equal(agent.totalSocketCount, 1);
    agent.destroy();
  });

  test('a destroyed socket left in the free list is passed over for a new one', async () => {
    const { agent, name, first: a } = await servedOnce();
    // destroyed but not yet removed: its 'close' runs later
    a.socket.destroy();
    assert.equal(agent.freeSockets[name]?.length, 1);
    const b = await get(agent);
    assert.notEqual(b.socket, a.socket);
    assert.equal(b.reused, false);
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
    const agent = leanAgent(new http.Agent({ keepAlive: true }), { tls: false }) as Pool;
    const bodies: string[] = [];
    for (const to of [port, otherPort, port, otherPort, port]) {
      bodies.push((await get(agent, to)).body);
      await settled();
    }
    assert.deepEqual(bodies, [port, otherPort, port, otherPort, port].map((p) => `port ${p}`));
    assert.deepEqual(Object.keys(agent.freeSockets).sort(), [`127.0.0.1:${otherPort}:`, `127.0.0.1:${port}:`].sort());
    assert.equal(agent.totalSocketCount, 2);
    agent.destroy();
    other.closeAllConnections();
    other.close();
  });

  test('an idle pooled socket that fails leaves the pool, and no error goes unhandled', async () => {
    const { agent, name, first: a } = await servedOnce();
    assert.equal(agent.freeSockets[name]?.length, 1);
    const closed = new Promise((r) => a.socket.once('close', r));
    // without the pool's listener on the idle socket this error would be thrown out of the process
    a.socket.destroy(new Error('reset while idle'));
    await closed;
    assert.equal(name in agent.freeSockets, false);
    assert.equal(agent.totalSocketCount, 0);
    agent.destroy();
  });

  test('with a request queued for a socket, the freed socket goes to it and the pool ends with one free socket', async () => {
    const agent = leanAgent(new http.Agent({ keepAlive: true, maxSockets: 1 }), { tls: false }) as Pool;
    const name = `127.0.0.1:${port}:`;
    const [a, b] = await Promise.all([get(agent), get(agent)]);
    assert.equal(b.socket, a.socket);
    await settled();
    assert.equal(agent.totalSocketCount, 1);
    assert.equal(agent.freeSockets[name]?.length, 1);
    assert.equal(name in agent.requests, false);
    agent.destroy();
  });

  test('keepAliveHint reads the first Keep-Alive line, any case, as Node reads its header object', () => {
    assert.equal(keepAliveHint(['Content-Type', 'text/plain', 'Keep-Alive', 'timeout=5, max=100']), 5);
    assert.equal(keepAliveHint(['keep-alive', 'timeout=7', 'KEEP-ALIVE', 'timeout=1']), 7);
    assert.equal(keepAliveHint(['Keep-Alive', 'max=100, timeout=5']), null);
    assert.equal(keepAliveHint(['Content-Length', '2']), null);
    assert.equal(keepAliveHint([]), null);
  });
});
