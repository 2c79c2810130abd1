/**
 * Budget alerts through real sidecars: an upstream whose reported usage a request chooses,
 * a price that turns tokens into money, and a request whose cost is known before it is sent.
 *
 * Price: 1 per 1000 tokens, in and out. The upstream reports 100 prompt tokens and as many
 * completion tokens as the request's max_tokens, so a request with max_tokens M settles at
 * 0.1 + M / 1000; its hold is a little less (its prompt estimate is under 100 tokens).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { Redis } from 'ioredis';
import type { AlertTuning } from '../../src/obs/alerts/alerts.js';
import type { SyncRecord } from '../../src/protocol/records.js';
import { deleteByPrefixAndDisconnect } from './redis-harness.js';
import { TEST_REDIS_URL } from './redis-url.js';
import { startHarness, waitForLine, type Harness, type KeySpec } from './sidecar.js';
import { startFakeUpstream, type FakeUpstream, type Received } from './upstream.js';
import { startWebhookReceiver, type WebhookReceiver } from './webhook-receiver.js';

export const PRICE: SyncRecord = { type: 'price', model: 'gpt-4o*', input: 1, output: 1, per: 1000 };

/** The upstream's answer: usage of 100 prompt tokens and max_tokens completion tokens. */
export function usageByMaxTokens(_req: unknown, res: ServerResponse, rec: Received): void {
  const { max_tokens } = JSON.parse(rec.body.toString('utf8')) as { max_tokens: number };
  const text = JSON.stringify({ id: 'c', object: 'chat.completion', model: 'gpt-4o-mini', choices: [], usage: { prompt_tokens: 100, completion_tokens: max_tokens, total_tokens: 100 + max_tokens } });
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/**
 * A chat request costing 0.1 + maxTokens / 1000 once settled. Resolves with its status once
 * its access line is written, which is after its hold has settled.
 */
export async function spend(h: Harness, keyId: string, maxTokens: number): Promise<number> {
  const id = randomUUID();
  const res = await fetch(`${h.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${h.keys[keyId]}`, 'content-type': 'application/json', 'x-request-id': id },
    body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: maxTokens, messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  await waitForLine(h, (l) => l.req_id === id);
  return res.status;
}

/** Every holder touched so far checked, and every event found sent or given up, on each sidecar. */
export async function alertsIdle(...hs: Harness[]): Promise<void> {
  await Promise.all(hs.map((h) => h.sidecar.alerts.idle()));
}

/** The events of one holder (`key:k_1`) among bodies, in order. */
export function eventsOf(bodies: Record<string, unknown>[], holder: string): Record<string, unknown>[] {
  const [kind, ...id] = holder.split(':');
  return bodies.filter((b) => {
    const h = b.holder as { kind: string; id: string };
    return h.kind === kind && h.id === id.join(':');
  });
}

export interface AlertFleet {
  /** a sidecar on the shared Redis with its own webhook receiver, so each delivery says which instance made it */
  instance(o: { tuning: AlertTuning; thresholds?: number[] }): Promise<{ h: Harness; hook: WebhookReceiver }>;
  /** the fake upstream every instance forwards to (usageByMaxTokens) */
  upstream(): FakeUpstream;
  close(): Promise<void>;
}

/**
 * Sidecars sharing one Redis prefix and one upstream, for alerts across instances: `keys`
 * with their plain secrets fixed, so every instance knows each key as the same one.
 */
export async function alertFleet(o: { prefix: string; keys: Record<string, KeySpec>; records: SyncRecord[] }): Promise<AlertFleet> {
  const secrets = Object.fromEntries(Object.keys(o.keys).map((id) => [id, `sk-${o.prefix}-${id}-${randomBytes(8).toString('hex')}`]));
  const keys = Object.fromEntries(Object.entries(o.keys).map(([id, spec]) => [id, { ...spec, secret: secrets[id] }]));
  const up = await startFakeUpstream(usageByMaxTokens);
  const hooks: WebhookReceiver[] = [];
  const sidecars: Harness[] = [];
  return {
    async instance({ tuning, thresholds }) {
      const hook = await startWebhookReceiver();
      hooks.push(hook);
      const alerts = { webhookUrl: hook.url, ...(thresholds ? { thresholds } : {}) };
      const h = await startHarness({ upstream: up.url, config: { redis: { url: TEST_REDIS_URL, prefix: o.prefix, timeoutMs: 1000 }, alerts }, keys, records: o.records, alertTuning: tuning });
      sidecars.push(h);
      return { h, hook };
    },
    upstream: () => up,
    async close() {
      await Promise.all(sidecars.map((h) => h.close()));
      await Promise.all(hooks.map((h) => h.close()));
      await up.close();
      await deleteByPrefixAndDisconnect(new Redis(TEST_REDIS_URL), o.prefix);
    },
  };
}
