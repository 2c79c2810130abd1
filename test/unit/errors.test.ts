import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CATALOGUE, deny, renderError, STATUS, type Denial, type ErrorCode } from '../../src/errors.js';

/** A denial with a message of the test's choosing (renderError must not care where it came from). */
const denial = (code: ErrorCode, message: string, extra: Omit<Denial, 'code' | 'message'> = {}): Denial => ({ code, message, ...extra });

// DESIGN section 5: code -> status. Kept literal here so a change to the catalogue shows up.
const EXPECTED: Record<ErrorCode, number> = {
  not_found: 404,
  invalid_path: 400,
  missing_api_key: 401,
  conflicting_api_keys: 401,
  invalid_api_key: 401,
  api_key_deleted: 401,
  ip_not_allowed: 403,
  browser_request_refused: 403,
  project_disabled: 402,
  key_budget_exhausted: 402,
  project_budget_exhausted: 402,
  insufficient_balance: 402,
  invalid_request: 400,
  body_too_large: 413,
  model_not_allowed: 403,
  route_capacity_exceeded: 429,
  rpm_exceeded: 429,
  tpm_exceeded: 429,
  concurrency_exceeded: 429,
  upstream_unavailable: 502,
  upstream_timeout: 504,
  not_ready: 503,
  limits_unavailable: 503,
  internal_error: 500,
};

const OPENAI_TYPE: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'insufficient_quota',
  403: 'permission_error',
  404: 'invalid_request_error',
  413: 'invalid_request_error',
  429: 'rate_limit_error',
  500: 'api_error',
  502: 'api_error',
  503: 'api_error',
  504: 'api_error',
};

const MESSAGES_TYPE: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  502: 'api_error',
  503: 'api_error',
  504: 'api_error',
};

const CODES = Object.keys(EXPECTED) as ErrorCode[];
// non-ASCII so that content-length (bytes) differs from the string length
const MESSAGE = 'Something went wrong — "quoted" … ünïcode';

test('STATUS covers exactly the DESIGN catalogue', () => {
  assert.deepEqual(STATUS, EXPECTED);
});

for (const code of CODES) {
  const status = EXPECTED[code];
  test(`renderError ${code}: ${status} in both styles`, () => {
    const oa = renderError(denial(code, MESSAGE), 'openai');
    const ms = renderError(denial(code, MESSAGE), 'messages');
    for (const r of [oa, ms]) {
      assert.equal(r.status, status);
      assert.equal(r.headers['content-type'], 'application/json');
      assert.equal(r.headers['x-keyward-error'], code);
      assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.body)));
      assert.notEqual(Number(r.headers['content-length']), r.body.length);
      const shouldRetry = status === 401 || status === 402 || status === 403;
      assert.equal(r.headers['x-should-retry'], shouldRetry ? 'false' : undefined);
      if (status === 429) {
        assert.match(r.headers['retry-after'] ?? '', /^[1-9]\d*$/);
        assert.match(r.headers['retry-after-ms'] ?? '', /^\d+$/);
      } else {
        assert.equal(r.headers['retry-after'], undefined);
        assert.equal(r.headers['retry-after-ms'], undefined);
      }
    }
    assert.deepEqual(JSON.parse(oa.body), { error: { message: MESSAGE, type: OPENAI_TYPE[status], code } });
    assert.deepEqual(Object.keys(JSON.parse(oa.body).error), ['message', 'type', 'code']);
    assert.deepEqual(JSON.parse(ms.body), { type: 'error', error: { type: MESSAGES_TYPE[status], message: MESSAGE } });
  });
}

test('project_disabled with a 403 override (files routes)', () => {
  const d = denial('project_disabled', 'The project is disabled.', { status: 403 });
  assert.deepEqual(d, { code: 'project_disabled', message: 'The project is disabled.', status: 403 });
  const oa = renderError(d, 'openai');
  const ms = renderError(d, 'messages');
  assert.equal(oa.status, 403);
  assert.equal(ms.status, 403);
  assert.equal(JSON.parse(oa.body).error.type, 'permission_error');
  assert.equal(JSON.parse(oa.body).error.code, 'project_disabled');
  assert.equal(JSON.parse(ms.body).error.type, 'permission_error');
  assert.equal(oa.headers['x-keyward-error'], 'project_disabled');
  assert.equal(oa.headers['x-should-retry'], 'false');
  // without the override it is the 402 of model routes
  const plain = renderError(denial('project_disabled', 'x'), 'openai');
  assert.equal(plain.status, 402);
  assert.equal(JSON.parse(plain.body).error.type, 'insufficient_quota');
  assert.equal(JSON.parse(renderError(denial('project_disabled', 'x'), 'messages').body).error.type, 'billing_error');
});

// [retryAfterMs, Retry-After seconds, retry-after-ms]
const RETRY: [number | undefined, string, string | null][] = [
  [1, '1', '1'],
  [250, '1', '250'],
  [999.2, '1', '1000'],
  [1000, '1', '1000'],
  [1001, '2', '1001'],
  [1500, '2', '1500'],
  [2000, '2', '2000'],
  [59_999, '60', '59999'],
  [60_000, '60', '60000'],
  [541_836, '542', '541836'],
  [0, '1', null],
  [-5, '1', null],
  [undefined, '1', null],
];

for (const [ms, secs, msHeader] of RETRY) {
  test(`429 Retry-After for retryAfterMs=${ms}: ${secs}s`, () => {
    for (const code of ['rpm_exceeded', 'tpm_exceeded', 'concurrency_exceeded', 'route_capacity_exceeded'] as const) {
      for (const style of ['openai', 'messages'] as const) {
        const r = renderError(denial(code, 'slow down', ms === undefined ? undefined : { retryAfterMs: ms }), style);
        assert.equal(r.status, 429);
        assert.equal(r.headers['retry-after'], secs);
        const h = r.headers['retry-after-ms'];
        assert.ok(h !== undefined && /^\d+$/.test(h), `retry-after-ms ${h}`);
        if (msHeader !== null) assert.equal(h, msHeader);
        // The openai SDK takes a minute or more for no wait: such a 429 says not to retry.
        assert.equal(r.headers['x-should-retry'], ms !== undefined && ms >= 60_000 ? 'false' : undefined);
      }
    }
  });
}

test('Retry-After is consistent with retry-after-ms (never shorter)', () => {
  for (let ms = 1; ms < 5000; ms += 37) {
    const r = renderError(denial('rpm_exceeded', 'x', { retryAfterMs: ms }), 'openai');
    const secs = Number(r.headers['retry-after']);
    assert.ok(Number.isInteger(secs) && secs >= 1);
    assert.ok(secs * 1000 >= Number(r.headers['retry-after-ms']), `ms=${ms}`);
    assert.ok((secs - 1) * 1000 < Number(r.headers['retry-after-ms']), `ms=${ms}: rounded up, not more`);
  }
});

test('a 503 with a wait carries Retry-After; other non-429 denials never do', () => {
  const r = renderError(denial('limits_unavailable', 'x', { retryAfterMs: 2500 }), 'openai');
  assert.equal(r.status, 503);
  assert.equal(r.headers['retry-after'], '3');
  assert.equal(renderError(denial('not_ready', 'x'), 'openai').headers['retry-after'], undefined);
  assert.equal(renderError(denial('model_not_allowed', 'x', { retryAfterMs: 2500 }), 'openai').headers['retry-after'], undefined);
});

test('deny takes the message from the catalogue, fills its placeholders, and keeps only the extras given', () => {
  assert.deepEqual(deny('rpm_exceeded'), { code: 'rpm_exceeded', message: CATALOGUE.rpm_exceeded.message });
  assert.deepEqual(deny('rpm_exceeded', { retryAfterMs: 5 }), { code: 'rpm_exceeded', message: CATALOGUE.rpm_exceeded.message, retryAfterMs: 5 });
  assert.equal(deny('model_not_allowed', { params: { model: 'gpt-4o' } }).message, 'This key may not use the model "gpt-4o".');
  assert.equal(deny('model_not_allowed', { variant: 'unnamed' }).message, CATALOGUE.model_not_allowed.variants.unnamed);
  assert.equal(deny('body_too_large', { params: { limit: 10 } }).message, 'The request body is larger than 10 bytes.');
  assert.equal(deny('invalid_request', { detail: 'bad JSON at byte 3' }).message, 'bad JSON at byte 3');
  assert.deepEqual(deny('project_disabled', { status: 403 }), { code: 'project_disabled', message: CATALOGUE.project_disabled.message, status: 403 });
});

test('every code has a message; no message is left with an unfilled placeholder when its params are given', () => {
  for (const [code, entry] of Object.entries(CATALOGUE)) {
    assert.ok(entry.message.length > 10, code);
    for (const text of [entry.message, ...Object.values((entry as { variants?: Record<string, string> }).variants ?? {})]) {
      const names = [...text.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!);
      const filled = deny(code as ErrorCode, { params: Object.fromEntries(names.map((n) => [n, 'X'])) });
      if (text === entry.message) assert.doesNotMatch(filled.message, /\{\w+\}/, code);
    }
  }
});

test('messages are JSON-escaped, not interpolated', () => {
  const tricky = 'a"b\\c\n</script>\u0000';
  for (const style of ['openai', 'messages'] as const) {
    const r = renderError(denial('invalid_request', tricky), style);
    assert.equal(JSON.parse(r.body).error.message, tricky);
  }
});
