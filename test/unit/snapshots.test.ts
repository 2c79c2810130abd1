/**
 * The config snapshots a reload swaps (src/proxy/snapshot.ts) and their forwarding targets
 * (src/proxy/upstream/targets.ts), against real HTTP servers: an upstream a reload leaves
 * unchanged keeps its agent and its warm connection; one it drops keeps serving the
 * requests that arrived before the reload, and its pooled connection is closed only once
 * the last of them has ended.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo, Socket } from 'node:net';
import { configSchema } from '../../src/config/schema.js';
import { snapshotOf, Snapshots } from '../../src/proxy/snapshot.js';
import { createForwarder } from '../../src/proxy/upstream/forward.js';
import type { Target } from '../../src/proxy/upstream/targets.js';

interface Upstream {
  url: string;
  /** connections the server has open now */
  open: Set<Socket>;
  server: http.Server;
}

async function upstream(): Promise<Upstream> {
  const open = new Set<Socket>();
  const server = http.createServer((_req, res) => res.end('ok'));
  server.on('connection', (s: Socket) => {
    open.add(s);
    s.once('close', () => open.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, open, server };
}

/** One GET through a target's agent; resolves once the socket is back in the agent's pool. */
function through(t: Target): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: t.url.hostname, port: t.url.port, path: '/', agent: t.agent }, (res) => {
      res.resume();
      res.on('end', () => setImmediate(resolve));
    });
    req.on('error', reject);
    req.end();
  });
}

/** Resolves once `cond` holds, checked on each close of an upstream connection. */
function untilClosed(u: Upstream, cond: () => boolean): Promise<void> {
  if (cond()) return Promise.resolve();
  return new Promise((resolve) => {
    const check = () => {
      if (cond()) resolve();
      else for (const s of u.open) s.once('close', check);
    };
    for (const s of u.open) s.once('close', check);
  });
}

let a: Upstream;
let b: Upstream;
let c: Upstream;
before(async () => {
  [a, b, c] = await Promise.all([upstream(), upstream(), upstream()]);
});
after(() => {
  for (const u of [a, b, c]) {
    u.server.closeAllConnections();
    u.server.close();
  }
});

const config = (upstreams: Record<string, string>) =>
  configSchema.parse({ upstreams: Object.fromEntries(Object.entries(upstreams).map(([k, url]) => [k, { url }])) });

test('a reload keeps unchanged targets and closes a dropped one once its last request has ended', async () => {
  const forwarder = createForwarder({});
  const first = config({ default: a.url, batch: b.url });
  const snapshots = new Snapshots(snapshotOf(first, forwarder.targets(first.upstreams, null)));

  // A request arrives under the first config and reaches both upstreams' pools.
  const held = snapshots.take();
  await through(held.targets.get('default'));
  await through(held.targets.get('batch'));
  assert.equal(held.targets.get('nowhere'), held.targets.get('default'), 'an unknown mode goes to default');
  assert.equal(a.open.size, 1);
  assert.equal(b.open.size, 1);

  // The reload: default unchanged, batch moved to another upstream.
  const second = config({ default: a.url, batch: c.url });
  snapshots.swap(snapshotOf(second, forwarder.targets(second.upstreams, snapshots.inForce.targets)));
  const now = snapshots.inForce;
  assert.notEqual(now, held);
  assert.equal(now.config, second);
  assert.equal(now.targets.get('default'), held.targets.get('default'), 'the unchanged upstream keeps its target and agent');
  assert.notEqual(now.targets.get('batch'), held.targets.get('batch'));

  // The old request still forwards where it started, on the warm connection.
  await through(held.targets.get('batch'));
  assert.equal(b.open.size, 1, 'the dropped target is still open while a request holds it');

  // It ends: the dropped target's pooled connection is closed; the kept one stays.
  snapshots.release(held);
  await untilClosed(b, () => b.open.size === 0);
  assert.equal(a.open.size, 1, 'the kept target\'s connection is untouched');
  await through(now.targets.get('default'));
  assert.equal(a.open.size, 1, 'and reused');

  forwarder.close();
  await untilClosed(a, () => a.open.size === 0);
});

test('a replaced snapshot nobody holds lets go of its dropped targets at once', async () => {
  const forwarder = createForwarder({});
  const first = config({ default: b.url });
  const snapshots = new Snapshots(snapshotOf(first, forwarder.targets(first.upstreams, null)));
  const s = snapshots.take();
  await through(s.targets.get('default'));
  snapshots.release(s);
  assert.equal(b.open.size, 1, 'the snapshot in force keeps its connection when its last request ends');
  const second = config({ default: c.url });
  snapshots.swap(snapshotOf(second, forwarder.targets(second.upstreams, snapshots.inForce.targets)));
  await untilClosed(b, () => b.open.size === 0);
  forwarder.close();
});
