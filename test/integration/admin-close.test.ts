/**
 * DESIGN section 9: SIGTERM ends in exit 0 after the grace. The admin listener closes with
 * the sidecar, and a client holding a connection to it (an idle scraper, a scanner that
 * sent half a request head and stopped) must not keep the process from exiting: its
 * connection is ended, not waited for.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { startAdmin } from '../../src/obs/admin.js';

const exposition = { contentType: 'text/plain; version=0.0.4; charset=utf-8' as const, metrics: async () => '' };

test('closing the admin listener ends idle, kept-alive and half-sent connections', async () => {
  const admin = await startAdmin({ host: '127.0.0.1', port: 0, exposition, notReadyReason: () => null });
  const connect = async () => {
    const s = net.connect(admin.port, '127.0.0.1');
    await once(s, 'connect');
    return s;
  };
  const silent = await connect();
  const half = await connect();
  half.write('GET /metrics HTTP/1.1\r\nHost: a\r\n');
  const kept = await connect();
  kept.write('GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n');
  await once(kept, 'data');
  const closed = [silent, half, kept].map((s) => once(s, 'close'));
  let guard: NodeJS.Timeout | undefined;
  const stuck = new Promise((_, reject) => (guard = setTimeout(() => reject(new Error('close() still waiting after 20 s')), 20_000)));
  try {
    await Promise.race([admin.close(), stuck]);
    await Promise.race([Promise.all(closed), stuck]);
  } finally {
    clearTimeout(guard);
    for (const s of [silent, half, kept]) s.destroy();
  }
  assert.equal(admin.server.listening, false);
});
