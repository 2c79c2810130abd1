import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { HOP_BY_HOP_NAMES, NameSet, outgoingHeaders } from '../../src/proxy/upstream/header-lines.js';

/** The outgoing object as entries, with each value copied (a list is compared by content). */
const entries = (h: ReturnType<typeof outgoingHeaders>): [string, unknown][] => Object.entries(h).map(([k, v]) => [k, Array.isArray(v) ? [...v] : v]);

/** What Node's server makes of a raw request head: its raw lines and its header object's names. */
async function received(head: string): Promise<{ raw: string[]; known: string[] }> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  try {
    const socket = connect((server.address() as AddressInfo).port, '127.0.0.1');
    socket.on('error', () => {});
    socket.write(head);
    const [req] = (await once(server, 'request')) as [IncomingMessage];
    const seen = { raw: [...req.rawHeaders], known: Object.keys(req.headers) };
    socket.destroy();
    return seen;
  } finally {
    server.closeAllConnections();
    server.close();
  }
}

test('outgoing header lines: with Node\'s own names known, the same lines as without, repeats and all', async () => {
  const heads = [
    'POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nAuthorization: Bearer k\r\nContent-Length: 0\r\n\r\n',
    // repeated names, in other letter cases, one of them a header Node keeps only once
    'GET /v1/models HTTP/1.1\r\nHost: a\r\nX-Tag: 1\r\nAccept: */*\r\nx-tag: 2\r\nCONTENT-TYPE: a\r\ncontent-type: b\r\nX-TAG: 3\r\n\r\n',
    // hop-by-hop lines and names a Connection line lists, a repeat right at the start
    'GET /v1/models HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nHost: a\r\nConnection: keep-alive, X-Drop\r\nX-Drop: d\r\nKeep-Alive: 5\r\nTE: trailers\r\nX-B: b\r\n\r\n',
    // names an object holds oddly
    'GET /v1/models HTTP/1.1\r\nHost: a\r\n__proto__: p\r\nconstructor: c\r\ntoString: t\r\nConstructor: C\r\n\r\n',
  ];
  for (const head of heads) {
    const { raw, known } = await received(head);
    assert.deepEqual(entries(outgoingHeaders(raw, { known })), entries(outgoingHeaders(raw)), head);
  }
  const { raw, known } = await received(heads[1]!);
  assert.deepEqual(entries(outgoingHeaders(raw, { known })), [['host', 'a'], ['x-tag', ['1', '2', '3']], ['accept', '*/*'], ['content-type', ['a', 'b']]]);
});

test('outgoing header lines: a wrong or partial list of known names changes nothing', () => {
  let seed = 11;
  const next = (n: number): number => Math.floor(((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31) * n);
  const pool = ['Host', 'host', 'X-A', 'x-a', 'Content-Length', 'connection', 'Connection', 'keep-alive', 'traceparent', 'X-B', '__proto__', 'toString', 'te'];
  for (let round = 0; round < 2000; round++) {
    const raw: string[] = [];
    for (let n = next(8); n > 0; n--) {
      const name = pool[next(pool.length)]!;
      raw.push(name, name.toLowerCase() === 'connection' ? ['x-a', 'close', 'X-B, te'][next(3)]! : `v${next(100)}`);
    }
    // Node's names in order, reversed, with one missing or one extra, or names of nothing
    // sent; each name once, as an object's keys are
    const distinct = [...new Set(raw.filter((_, i) => i % 2 === 0).map((r) => r.toLowerCase()))];
    const extra = [...new Set([...distinct.slice(0, 1), 'content-length', ...distinct.slice(1)])];
    const known = [distinct, [...distinct].reverse(), distinct.slice(1), extra, ['x-z', 'x-y']][next(5)]!;
    const traceparent = next(3) === 0 ? '00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01' : null;
    assert.deepEqual(entries(outgoingHeaders(raw, { known, traceparent })), entries(outgoingHeaders(raw, { traceparent })), JSON.stringify({ raw, known }));
  }
});

test('NameSet: a member or not, as a Set of the same names answers', () => {
  const members = [...HOP_BY_HOP_NAMES, 'transfer-encoding', 'x-ratelimit-limit-requests', 'x-ratelimit-limit-tokens', 'te'];
  const names = new NameSet(members);
  const set = new Set(members);
  const asked = [...members, 'Connection', 'connectio', 'connections', 'ta', 't', '', 'x-ratelimit-limit-request', 'content-type', 'a'.repeat(200)];
  for (const name of asked) assert.equal(names.has(name), set.has(name), name);
  assert.equal(new NameSet([]).has(''), false);
});
