/**
 * The ledger-news subscriber (src/limits/redis/ledger-news.ts) after its connection is
 * dropped: it subscribes again and hears news, and a refused subscription (the user's
 * ACL lost the channel, so Redis drops the subscriber and refuses it with NOPERM) ends
 * nothing: no unhandled rejection, which would end a real process.
 */
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { after, before, test } from 'node:test';
import { Redis } from 'ioredis';
import { createRedisClient, whenServing } from '../../src/limits/redis/client.js';
import { LEDGER_NEWS_CHANNEL, listenForLedgerNews, type LedgerNews } from '../../src/limits/redis/ledger-news.js';
import { uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const admin = new Redis(TEST_REDIS_URL, { lazyConnect: true });
const user = uid('kw-news');
const password = uid('pw');
const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown) => void unhandled.push(reason);
/** every listener's close, run after the cases (also after one that timed out waiting) */
const closers: (() => void)[] = [];

/** A listener under `user`; `events` emits each SUBSCRIBE's outcome ('outcome') and each message heard ('heard'). */
async function listener(): Promise<{ news: LedgerNews; events: EventEmitter }> {
  const url = new URL(TEST_REDIS_URL);
  url.username = user;
  url.password = password;
  const client = createRedisClient({ url: url.toString(), timeoutMs: 2_000 });
  await whenServing(client);
  const events = new EventEmitter();
  const news = listenForLedgerNews(client, (m) => void events.emit('heard', m), { subscribed: (err) => void events.emit('outcome', err) });
  closers.push(() => {
    news.close();
    client.disconnect();
  });
  return { news, events };
}

/** The next SUBSCRIBE outcome: null when it took. */
const outcome = async (events: EventEmitter): Promise<Error | null> => ((await once(events, 'outcome')) as [Error | null])[0];

/** Lets a rejection nobody handled be reported (Node reports them once the microtasks have run). */
const turns = async (n: number) => {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
};

before(async () => {
  process.on('unhandledRejection', onUnhandled);
  await admin.connect();
  await admin.call('ACL', 'SETUSER', user, 'on', `>${password}`, '~*', '+@all', 'allchannels');
});
after(async () => {
  for (const close of closers) close();
  process.off('unhandledRejection', onUnhandled);
  await admin.call('ACL', 'DELUSER', user);
  admin.disconnect();
});

test('a dropped subscriber connection subscribes again and hears the next news', { timeout: 10_000 }, async () => {
  const l = await listener();
  const first = outcome(l.events);
  assert.equal(await first, null, 'the first subscription took');
  await l.news.listening;
  const again = outcome(l.events);
  assert.equal(Number(await admin.call('CLIENT', 'KILL', 'USER', user, 'TYPE', 'pubsub')), 1, 'the subscriber connection was dropped');
  assert.equal(await again, null, 'subscribed again on the new connection');
  const message = uid('ledger');
  const heard = once(l.events, 'heard');
  await admin.publish(LEDGER_NEWS_CHANNEL, message);
  assert.deepEqual(await heard, [message]);
});

test("the user's channels revoked: the refused subscription is handled, and nothing is left unhandled", { timeout: 10_000 }, async () => {
  const l = await listener();
  const first = outcome(l.events);
  assert.equal(await first, null, 'the first subscription took');
  const next = outcome(l.events);
  await admin.call('ACL', 'SETUSER', user, 'resetchannels');
  const refused = await next;
  assert.match(String(refused?.message), /NOPERM/, 'the new connection was refused the channel');
  await turns(3);
  assert.deepEqual(unhandled, [], 'no rejection left unhandled');
});
