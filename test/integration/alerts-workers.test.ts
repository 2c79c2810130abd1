/**
 * Budget alerts with `keyward serve --workers 2` (a real primary and two worker processes,
 * the real Redis, a replica fed by `keyward import`): each worker watches the holders of
 * the requests it serves and claims what it sees crossed; the claim in Redis keeps each
 * threshold to one event, and the workers' counts add up on the primary's /metrics.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { PRICE, eventsOf, usageByMaxTokens } from '../helpers/alerts.js';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { accessOf, importReplica, metricSum, scrape } from '../helpers/instance.js';
import { bearer, send } from '../helpers/http.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = `kwaw${randomBytes(4).toString('hex')}`;
const secret = `sk-alerted-${randomBytes(8).toString('hex')}`;

let dir: string;
let up: FakeUpstream;
let hook: WebhookReceiver;
let kw: SidecarProcess;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-alerts-workers-'));
  up = await startFakeUpstream(usageByMaxTokens);
  hook = await startWebhookReceiver();
  const replica = join(dir, 'replica.sqlite');
  const snapshot = join(dir, 'snapshot.ndjson');
  const key = {
    type: 'key', id: 'k_w', hash: makeKeyHasher({ hash: 'sha256' })(secret), kind: 'team', user: null, project: 'p_free', status: 'active',
    budget: 10, spent: 7.7, models: null, routing: null, rpm: null, tpm: null, concurrency: null,
  };
  const records = [{ type: 'meta', version: 1 }, PRICE, { type: 'project', id: 'p_free', status: 'enabled', budget: null, spent: 0 }, key];
  writeFileSync(snapshot, records.map((r) => JSON.stringify(r)).join('\n') + '\n');
  await importReplica(snapshot, replica);
  const yaml =
    `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${replica} }\n` +
    `redis: { url: ${TEST_REDIS_URL}, prefix: ${prefix}, timeoutMs: 1000 }\nalerts: { webhookUrl: ${hook.url} }\nlogging: { level: info }\n`;
  kw = await spawnSidecar({ dir, name: 'alerted-workers', yaml, args: ['--workers', '2'] });
});

after(async () => {
  await kw?.stop('SIGKILL');
  await up?.close();
  await hook?.close();
  const redis = new Redis(TEST_REDIS_URL);
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

test('both workers see the key cross 80 %; one event is sent, counted once on the primary', async () => {
  // Eight requests at once, each on its own connection (the cluster hands them to the workers
  // in turn), 0.2 apiece: the key goes from 7.7 to 9.3 of 10.
  const ids = Array.from({ length: 8 }, (_, i) => `alert-${prefix}-${i}`);
  const body = JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
  const rs = await Promise.all(
    ids.map((id) => send(kw.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(secret), 'content-type': 'application/json', 'x-request-id': id }, body })),
  );
  assert.deepEqual(rs.map((r) => r.status), Array(8).fill(200));
  const lines = await accessOf(kw, ids);
  assert.equal(new Set(lines.map((l) => l.worker)).size, 2, 'both workers served the key');

  await hook.until(() => eventsOf(hook.accepted(), 'key:k_w').length > 0, 'the event');
  // The worker that sent it counts it once its delivery is answered.
  const deadline = Date.now() + 10_000;
  const sent = async () => metricSum(await scrape(kw), 'keyward_alerts_total{result="sent"}');
  while ((await sent()) < 1) assert.ok(Date.now() < deadline, 'keyward_alerts_total{result="sent"} did not reach 1 within 10 s');

  // Draining finishes every check and delivery of both workers: nothing more arrives.
  assert.equal(await kw.stop('SIGTERM'), 0);
  const events = eventsOf(hook.accepted(), 'key:k_w');
  assert.deepEqual(events.map((e) => [e.threshold, e.budget, e.epoch]), [[0.8, 10, 0]]);
  assert.equal(hook.received.length, 1);
  assert.equal(hook.received[0]!.headers['x-keyward-signature'], undefined);
  assert.equal(kw.lines.filter((l) => l.includes('budget alert sent')).length, 1);
});
