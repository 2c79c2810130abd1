/**
 * DESIGN section 5 as a table: each row is a request and the state behind it, and the
 * code the pipeline must answer — the first failing check in the section's order. Rows
 * that fail several checks at once prove the order. No sockets: the pipeline gets a
 * replica lookup, the in-process limiter and a body reader.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { deny, STATUS, type Denial } from '../../src/errors.js';
import { createMemoryLimiter } from '../../src/limits/memory.js';
import type { FactsKey, FactsProject, KeyFacts } from '../../src/policy/facts.js';
import type { BodyResult } from '../../src/proxy/body/read.js';
import { decide, type PipelineDeps } from '../../src/proxy/pipeline.js';
import { snapshotOf } from '../../src/proxy/snapshot.js';
import { TargetSet } from '../../src/proxy/upstream/targets.js';
import { configSchema } from '../../src/config/schema.js';

const hashKey = makeKeyHasher({ hash: 'sha256' });
/** The config the requests arrive under: the schema's defaults, a smaller JSON body limit, and a row's `limits.shadow`. */
function snapshotWith(shadow: string[] = [], capacity?: { concurrency: number; rpm: number }) {
  const upstreams = { default: { url: 'http://127.0.0.1:9', ...(capacity ? { capacity } : {}) } };
  const config = configSchema.parse({ server: { maxJsonBodyBytes: 1 << 20, maxUploadBytes: 0, refuseBrowsers: true }, limits: { defaultOutputTokens: 1024, shadow }, upstreams });
  return snapshotOf(config, TargetSet.build({ upstreams: config.upstreams, previous: null, created: () => {}, destroyed: () => {} }));
}

function facts(over: { key?: Partial<FactsKey>; project?: Partial<FactsProject> | null; wallet?: number | null } = {}): KeyFacts {
  const key: FactsKey = {
    id: 'k_1', kind: 'team', userId: null, projectId: 'p_1', status: 'active', budget: null, spent: 0,
    models: null, routing: null, rpm: null, tpm: null, concurrency: null,
    epoch: 0, ips: null, allowBrowser: false, modelLimits: null, period: null, shadow: [], ...over.key,
  };
  const project: FactsProject | null = over.project === null ? null : { id: 'p_1', status: 'enabled', budget: null, spent: 0, epoch: 0, ...over.project };
  return { key, project, walletBalance: over.wallet ?? null, walletEpoch: over.wallet === undefined || over.wallet === null ? null : 0 };
}

const personal = (wallet: number, key: Partial<FactsKey> = {}) =>
  facts({ key: { kind: 'personal', userId: 'u_1', projectId: null, ...key }, project: null, wallet });

type BodyCase = 'ok' | 'gpt-4o' | 'invalid' | 'too-large';

function bodyResult(c: BodyCase, maxOutputTokens: number | null = 16): BodyResult {
  if (c === 'invalid') return { ok: false, denial: deny('invalid_request', { detail: 'The request body is not valid JSON.' }), closeConnection: false };
  if (c === 'too-large') return { ok: false, denial: deny('body_too_large', { params: { limit: 10 } }), closeConnection: true };
  const model = c === 'ok' ? 'gpt-4o-mini' : 'gpt-4o';
  return { ok: true, body: { model, models: [], maxOutputTokens, background: false, estimateBytes: 100, replay: { pipe: (d) => d }, bytesSeen: null } };
}

interface Row {
  name: string;
  method?: string;
  url?: string;
  /** the credential header lines; default one Bearer key */
  headers?: string[];
  state?: KeyFacts | null;
  ready?: boolean;
  body?: BodyCase;
  /** requests already admitted for this key this minute (with rpm 1 set on the key) */
  rpmUsed?: boolean;
  clientIp?: string;
  /** the config's `limits.shadow` */
  shadow?: string[];
  expect: string;
  /** the codes of shadowed checks that would have refused, comma separated; default none */
  shadowed?: string;
}

const NON_ASCII_KEY = 'kw-clé-456';
const deleted = { key: { status: 'deleted' as const } };
const everyLaterFailure = { key: { models: ['claude-*'], budget: 1, spent: 5, rpm: 1 }, project: { status: 'disabled' as const } };

const ROWS: Row[] = [
  { name: 'unknown route', url: '/v2/chat', expect: '404 not_found' },
  { name: 'dot segment', url: '/v1/../v1/chat/completions', expect: '400 invalid_path' },
  { name: 'a bad path beats a missing key', url: '/v1/%2e%2e/models', headers: [], expect: '400 invalid_path' },
  { name: 'replica not loaded: 503 before the credential is even read', ready: false, headers: [], expect: '503 not_ready' },
  { name: 'no key', headers: [], expect: '401 missing_api_key' },
  { name: 'two Authorization lines', headers: ['Authorization', 'Bearer sk-good', 'Authorization', 'Bearer sk-other'], expect: '401 conflicting_api_keys' },
  { name: 'x-api-key only on an openai route', headers: ['x-api-key', 'sk-good'], expect: '401 missing_api_key' },
  // Another key of the replica's where an upstream gateway may read one (Azure, Google, LiteLLM; x-api-key on Bearer routes).
  { name: 'a second known key in api-key beside the Bearer key', headers: ['Authorization', 'Bearer sk-good', 'api-key', 'sk-second'], expect: '401 conflicting_api_keys' },
  { name: 'a second known key in x-api-key on a Bearer route', headers: ['Authorization', 'Bearer sk-good', 'x-api-key', 'sk-second'], expect: '401 conflicting_api_keys' },
  { name: 'a second known key in x-litellm-api-key, even beside an unknown Bearer key', headers: ['Authorization', 'Bearer sk-unknown', 'x-litellm-api-key', 'Bearer sk-second'], state: null, expect: '401 conflicting_api_keys' },
  { name: 'messages: a second known key in x-goog-api-key', url: '/v1/messages', headers: ['x-api-key', 'sk-good', 'x-goog-api-key', 'sk-second'], state: personal(5), expect: '401 conflicting_api_keys' },
  // Every other header is looked up, not only the first: a provider key in one hides no key of the replica's in the next.
  { name: 'a provider key in x-goog-api-key, a known key in api-key', headers: ['Authorization', 'Bearer sk-good', 'x-goog-api-key', 'AIzaSyProviderKey', 'api-key', 'sk-second'], expect: '401 conflicting_api_keys' },
  { name: 'a provider key in api-key, a known key in x-litellm-api-key', headers: ['Authorization', 'Bearer sk-good', 'api-key', 'sk-provider-0123456789', 'x-litellm-api-key', 'Bearer sk-second'], expect: '401 conflicting_api_keys' },
  { name: 'a provider key in x-api-key, a known key in x_api_key', headers: ['Authorization', 'Bearer sk-good', 'x-api-key', 'sk-ant-provider', 'x_api_key', 'sk-second'], expect: '401 conflicting_api_keys' },
  // Node reads header values as latin1: the client's UTF-8 bytes arrive a character a byte, and are looked up as the key they spell.
  { name: 'a second known key outside ASCII in api-key', headers: ['Authorization', 'Bearer sk-good', 'api-key', Buffer.from(NON_ASCII_KEY).toString('latin1')], expect: '401 conflicting_api_keys' },
  { name: 'a provider key in x-goog-api-key is no credential', headers: ['Authorization', 'Bearer sk-good', 'x-goog-api-key', 'AIzaSyProviderKey'], expect: 'allow' },
  { name: 'the same key in api-key', headers: ['Authorization', 'Bearer sk-good', 'api-key', 'sk-good'], expect: 'allow' },
  { name: 'unknown key', state: null, expect: '401 invalid_api_key' },
  { name: 'deleted key beats every later failure', state: facts({ ...everyLaterFailure, key: { ...everyLaterFailure.key, ...deleted.key } }), body: 'invalid', rpmUsed: true, expect: '401 api_key_deleted' },
  { name: 'key limited to 10.0.0.0/8, from loopback', state: facts({ key: { ips: ['10.0.0.0/8'] } }), clientIp: '127.0.0.1', expect: '403 ip_not_allowed' },
  { name: 'key limited to 10.0.0.0/8, from inside it', state: facts({ key: { ips: ['10.0.0.0/8'] } }), clientIp: '10.1.2.3', expect: 'allow' },
  { name: 'network policy beats a disabled project and a spent budget', state: facts({ ...everyLaterFailure, key: { ...everyLaterFailure.key, ips: ['10.0.0.0/8'] } }), expect: '403 ip_not_allowed' },
  { name: 'a browser request (Origin) is refused', headers: ['Authorization', 'Bearer sk-good', 'Origin', 'https://app.example'], expect: '403 browser_request_refused' },
  { name: 'a browser request (Sec-Fetch-*) is refused', headers: ['Authorization', 'Bearer sk-good', 'Sec-Fetch-Mode', 'cors', 'Sec-Fetch-Site', 'cross-site'], expect: '403 browser_request_refused' },
  { name: 'a browser request from a key that allows browsers', headers: ['Authorization', 'Bearer sk-good', 'Origin', 'https://app.example', 'Sec-Fetch-Mode', 'cors'], state: facts({ key: { allowBrowser: true } }), expect: 'allow' },
  { name: "Node's fetch (a bare sec-fetch-mode: cors) is a server, not a browser", headers: ['Authorization', 'Bearer sk-good', 'sec-fetch-mode', 'cors'], expect: 'allow' },
  { name: 'self (GET /v1/key) needs only steps 1-3b', method: 'GET', url: '/v1/key', state: facts(everyLaterFailure), expect: 'allow' },
  { name: 'files: disabled project is 403', method: 'POST', url: '/v1/files', state: facts({ project: { status: 'disabled' } }), expect: '403 project_disabled' },
  { name: 'files: a spent budget does not matter', method: 'GET', url: '/v1/files', state: facts({ key: { budget: 1, spent: 5 } }), expect: 'allow' },
  { name: 'model: disabled project is 402 and beats the budgets', state: facts(everyLaterFailure), body: 'invalid', expect: '402 project_disabled' },
  { name: 'model: key budget before project budget', state: facts({ key: { budget: 1, spent: 1 }, project: { budget: 1, spent: 1 } }), expect: '402 key_budget_exhausted' },
  { name: 'model: project budget', state: facts({ project: { budget: 1, spent: 2 } }), expect: '402 project_budget_exhausted' },
  { name: 'model: empty wallet beats a bad body', state: personal(0), body: 'invalid', expect: '402 insufficient_balance' },
  { name: 'model: bad body beats scope and limits', state: facts({ key: { models: ['claude-*'], rpm: 1 } }), body: 'invalid', rpmUsed: true, expect: '400 invalid_request' },
  { name: 'model: body too large', body: 'too-large', expect: '413 body_too_large' },
  { name: 'model: scope beats limits', state: facts({ key: { models: ['claude-*'], rpm: 1 } }), rpmUsed: true, expect: '403 model_not_allowed' },
  { name: 'model: scope glob is anchored', state: facts({ key: { models: ['gpt-4o'] } }), body: 'ok', expect: '403 model_not_allowed' },
  { name: 'model: rpm', state: facts({ key: { rpm: 1 } }), rpmUsed: true, expect: '429 rpm_exceeded' },
  { name: 'model: all checks pass', state: personal(5, { models: ['gpt-4o*'], rpm: 1 }), expect: 'allow' },
  { name: 'listing needs only steps 1-3: a spent budget and a disabled project pass', method: 'GET', url: '/v1/models', state: facts(everyLaterFailure), rpmUsed: true, expect: 'allow' },
  { name: 'messages: x-api-key is read', url: '/v1/messages', headers: ['x-api-key', 'sk-good'], state: personal(5), expect: 'allow' },
  // Shadow limits (DESIGN section 12): a shadowed check that would refuse records its code and the request goes on.
  { name: 'shadow: an empty wallet with budget shadowed (config) goes on', state: personal(0), shadow: ['budget'], expect: 'allow', shadowed: 'insufficient_balance' },
  { name: "shadow: the key's own shadow list counts too", state: personal(0, { shadow: ['budget'] }), expect: 'allow', shadowed: 'insufficient_balance' },
  { name: 'shadow: both budgets spent, each code once, in order', state: facts({ key: { budget: 1, spent: 1 }, project: { budget: 1, spent: 2 } }), shadow: ['budget'], expect: 'allow', shadowed: 'key_budget_exhausted,project_budget_exhausted' },
  { name: 'shadow: a disabled project is not a budget check', state: facts({ key: { budget: 1, spent: 1 }, project: { status: 'disabled' } }), shadow: ['budget'], expect: '402 project_disabled' },
  { name: 'shadow: a shadowed budget does not shadow the body, scope or limits', state: facts({ key: { budget: 1, spent: 1, models: ['claude-*'] } }), shadow: ['budget'], expect: '403 model_not_allowed', shadowed: 'key_budget_exhausted' },
  { name: 'shadow: rpm shadowed goes on', state: facts({ key: { rpm: 1 } }), shadow: ['rpm'], rpmUsed: true, expect: 'allow', shadowed: 'rpm_exceeded' },
  { name: 'shadow: tpm shadowed does not cover rpm', state: facts({ key: { rpm: 1 } }), shadow: ['tpm', 'budget'], rpmUsed: true, expect: '429 rpm_exceeded' },
];

/** The pipeline's dependencies: `sk-good` is `state`, `sk-second` and the non-ASCII key are other keys of the replica's. */
function depsFor(state: KeyFacts | null, limiter: PipelineDeps['limiter'], o: { ready?: boolean; unknownRouting?: string[] } = {}): PipelineDeps {
  const second = facts({ key: { id: 'k_2' } });
  return {
    hashKey,
    keyFormat: 'any',
    lookup: (hash) => (hash === hashKey('sk-good') ? state : hash === hashKey('sk-second') || hash === hashKey(NON_ASCII_KEY) ? second : null),
    ready: () => o.ready ?? true,
    limiter,
    priceFor: () => ({ input: 1, output: 1, per: 1_000_000 }),
    onUnknownRouting: (mode) => o.unknownRouting?.push(mode),
  };
}

const BODY_ROUTES = new Set(['/v1/chat/completions', '/v1/messages']);

for (const row of ROWS) {
  test(`decision order: ${row.name} -> ${row.expect}`, async () => {
    const limiter = createMemoryLimiter({ leaseMs: 30_000 });
    const state = row.state === undefined ? facts() : row.state;
    const deps = depsFor(state, limiter, { ready: row.ready ?? true });
    if (row.rpmUsed && state) {
      const first = await limiter.admit({ keyId: state.key.id, limits: { rpm: 1, tpm: null, concurrency: null }, tokens: 0, route: { name: 'default', concurrency: 0, rpm: 0 } });
      assert.ok(first.ok, 'the earlier request uses up the minute');
    }
    let bodyReads = 0;
    const url = row.url ?? '/v1/chat/completions';
    const decision = await decide(
      {
        method: row.method ?? 'POST',
        url,
        rawHeaders: row.headers ?? ['Authorization', 'Bearer sk-good'],
        clientIp: row.clientIp ?? '127.0.0.1',
        readBody: async () => {
          bodyReads++;
          return bodyResult(row.body ?? 'ok');
        },
        openUpload: () => ({ ok: true, source: null }),
      },
      deps,
      snapshotWith(row.shadow),
    );
    const summary = decision.allow ? 'allow' : `${statusOf(decision.denial)} ${decision.denial.code}`;
    assert.equal(summary, row.expect);
    assert.equal(decision.seen.shadow.join(','), row.shadowed ?? '');
    // The body is read only once steps 1-5 have passed, and only on model routes.
    const stepsBeforeBody = /^(404|400 invalid_path|503|401|402|403 (project_disabled|ip_not_allowed|browser_request_refused))/.test(row.expect);
    if (stepsBeforeBody || !BODY_ROUTES.has(url)) assert.equal(bodyReads, 0, 'body read before its step');
    else assert.equal(bodyReads, 1);
    if (decision.allow) decision.lease?.finish({ tokens: null });
    await limiter.close();
  });
}

/** A model request with the default key and the given body, as the table's rows send it. */
const modelRequest = (body: BodyResult) => ({
  method: 'POST', url: '/v1/chat/completions', rawHeaders: ['Authorization', 'Bearer sk-good'], clientIp: '127.0.0.1',
  readBody: async () => body, openUpload: () => ({ ok: true as const, source: null }),
});

test("decision order: a routing mode that names no upstream goes to default, held to default's capacity", async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  const unknownRouting: string[] = [];
  const deps = depsFor(facts({ key: { routing: 'nope' } }), limiter, { unknownRouting });
  const snap = snapshotWith([], { concurrency: 0, rpm: 1 });
  const first = await decide(modelRequest(bodyResult('ok')), deps, snap);
  assert.ok(first.allow, 'the first request of the minute is admitted');
  assert.equal(first.seen.upstream, 'default', 'routed, counted and logged as default');
  assert.deepEqual(unknownRouting, ['nope']);
  first.lease?.finish({ tokens: null });
  const second = await decide(modelRequest(bodyResult('ok')), deps, snap);
  assert.equal(second.allow ? 'allow' : second.denial.code, 'route_capacity_exceeded', "default's capacity holds a key routed there by fallback");
  await limiter.close();
});

test('decision order: an output cap of 0 reserves the configured default output, as no cap does', async () => {
  const limiter = createMemoryLimiter({ leaseMs: 30_000 });
  const deps = depsFor(facts(), limiter);
  for (const [cap, output] of [[null, 1024], [0, 1024], [16, 16]] as const) {
    const d = await decide(modelRequest(bodyResult('ok', cap)), deps, snapshotWith());
    assert.ok(d.allow);
    assert.equal(d.estimate.output, output, `max_tokens ${cap}`);
    assert.equal(d.tokens, d.estimate.prompt + output, `the TPM reservation for max_tokens ${cap}`);
    d.lease?.finish({ tokens: null });
  }
  await limiter.close();
});

function statusOf(d: Denial): number {
  return d.status ?? STATUS[d.code];
}
