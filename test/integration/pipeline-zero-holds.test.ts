/**
 * The decision pipeline on a Redis limiter with spend slices (the default,
 * redis.lease.enabled) gives back every hold it takes. Two kinds of request take a hold of 0
 * on a budgeted key: one that is not metered (count_tokens: step 9 asks the budgets with a
 * hold of 0), and one a later step refuses (a bad body: step 5 with live spend asks the
 * same). A hold of 0 taken from a slice counts as in flight until settled; one left
 * unsettled keeps the slice from ending and its lease alive in Redis for as long as the
 * instance runs.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { configSchema } from '../../src/config/schema.js';
import { deny } from '../../src/errors.js';
import type { RedisLimiter } from '../../src/limits/redis/limiter.js';
import type { KeyFacts } from '../../src/policy/facts.js';
import type { BodyResult } from '../../src/proxy/body/read.js';
import { decide, type PipelineDeps } from '../../src/proxy/pipeline.js';
import { snapshotOf } from '../../src/proxy/snapshot.js';
import { TargetSet } from '../../src/proxy/upstream/targets.js';
import { leasingInstances } from '../helpers/redis-harness.js';
import { uid } from '../helpers/redis-limits-conformance.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const hashKey = makeKeyHasher({ hash: 'sha256' });
const config = configSchema.parse({ server: { maxJsonBodyBytes: 1 << 20, maxUploadBytes: 0 }, upstreams: { default: { url: 'http://127.0.0.1:9' } } });
const snap = snapshotOf(config, TargetSet.build({ upstreams: config.upstreams, previous: null, created: () => {}, destroyed: () => {} }));

const facts: KeyFacts = {
  key: {
    id: uid('k'), kind: 'team', userId: null, projectId: 'p_slices', status: 'active', budget: 100, spent: 0,
    models: null, routing: null, rpm: null, tpm: null, concurrency: null,
    epoch: 0, ips: null, allowBrowser: false, modelLimits: null, period: null, shadow: [],
  },
  project: { id: 'p_slices', status: 'enabled', budget: 1000, spent: 0, epoch: 0 },
  walletBalance: null,
  walletEpoch: null,
};

const okBody: BodyResult = { ok: true, body: { model: 'claude-x', models: [], maxOutputTokens: 16, background: false, estimateBytes: 40, replay: { pipe: (d) => d }, bytesSeen: null } };
const badBody: BodyResult = { ok: false, denial: deny('invalid_request', { detail: 'The request body is not valid JSON.' }), closeConnection: false };

let fleet: ReturnType<typeof leasingInstances>;
let lim: RedisLimiter;
before(async () => {
  fleet = leasingInstances(TEST_REDIS_URL, uid('kwtest'));
  ({ lim } = await fleet.instance());
});
after(async () => {
  await fleet.close();
});

function deps(): PipelineDeps {
  return { hashKey, keyFormat: 'any', lookup: (h) => (h === hashKey('sk-good') ? facts : null), ready: () => true, limiter: lim, priceFor: () => ({ input: 1, output: 1, per: 1_000_000 }), onUnknownRouting: () => {} };
}

async function send(url: string, body: BodyResult) {
  return decide({ method: 'POST', url, rawHeaders: ['x-api-key', 'sk-good'], clientIp: '127.0.0.1', readBody: async () => body, openUpload: () => ({ ok: true, source: null }) }, deps(), snap);
}

test('a metered request first: its hold settles, and the holders get slices', async () => {
  const d = await send('/v1/messages', okBody);
  assert.ok(d.allow && d.hold);
  d.hold.settle(0.00001);
  d.lease?.finish({ tokens: null });
  assert.equal(lim.stats().holdsHeld, 0);
});

test('count_tokens on a budgeted key: allowed, and no hold left in flight', async () => {
  for (let i = 0; i < 6; i++) {
    const d = await send('/v1/messages/count_tokens', okBody);
    assert.ok(d.allow, `request ${i}`);
    assert.equal(d.hold, null, 'a request that is not metered hands no hold to settle');
    d.lease?.finish({ tokens: null });
  }
  assert.equal(lim.stats().holdsHeld, 0, 'every hold of 0 was given back');
});

test('a bad body on a budgeted key: 400, and the live-budget question leaves no hold in flight', async () => {
  for (let i = 0; i < 6; i++) {
    const d = await send('/v1/messages', badBody);
    assert.equal(d.allow ? 'allow' : d.denial.code, 'invalid_request', `request ${i}`);
  }
  assert.equal(lim.stats().holdsHeld, 0, 'every hold of 0 was given back');
});
