/**
 * Cluster workers share one stdout: every write must hold whole lines and stay within
 * what a pipe takes atomically, or lines of two workers could interleave.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { capture } from '../helpers/log-capture.js';
import { createLogger, PIPE_ATOMIC_BYTES, type AccessLine } from '../../src/obs/logger.js';


const line = (i: number): AccessLine => ({
  req_id: `req-${i}`, method: 'POST', path: '/v1/chat/completions', route: 'chat.completions', status: 200, code: null,
  key_id: 'k_1', key_kind: 'personal', project_id: null, user_id: 'u_1', model: 'gpt-4o-mini', routing: 'default',
  app_name: 'é'.repeat(100), app_url: null, input_tokens: 10, output_tokens: 5, usage_estimated: false, client_ip: '127.0.0.1', api_version: null, duration_ms: 1.5, upstream_ms: 1, shadow: [],
});

test('shared stdout: access lines leave in whole-line writes within PIPE_ATOMIC_BYTES, each with the worker id', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination, fields: { worker: 3 }, shared: true });
  for (let i = 0; i < 100; i++) logger.access(line(i));
  logger.access.flush();
  assert.ok(writes.length > 1, 'the batch was split');
  for (const w of writes) {
    assert.ok(Buffer.byteLength(w) <= PIPE_ATOMIC_BYTES, `a write of ${Buffer.byteLength(w)} bytes`);
    assert.ok(w.endsWith('\n'));
  }
  const lines = writes.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(lines.map((l) => l.req_id), Array.from({ length: 100 }, (_, i) => `req-${i}`));
  for (const l of lines) assert.equal(l.worker, 3);
});

test('a single process keeps one write per batch and no worker field', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination });
  for (let i = 0; i < 100; i++) logger.access(line(i));
  logger.access.flush();
  assert.equal(writes.length, 1);
  assert.equal((JSON.parse(writes[0]!.split('\n')[0]!) as Record<string, unknown>).worker, undefined);
});

test('shared stdout: a line over PIPE_ATOMIC_BYTES (long non-ASCII client fields) is cut to fit one write, marked; a single process keeps it whole', () => {
  const long = (c: string, n: number) => c.repeat(n);
  const big: AccessLine = {
    ...line(7), path: `/v1/${long('€', 508)}`, model: long('€', 256), app_name: long('€', 256), app_url: long('\u0001', 256), api_version: long('€', 256),
  };
  const shared = capture();
  const logger = createLogger({ level: 'info', destination: shared.destination, fields: { worker: 1 }, shared: true });
  logger.access(line(1));
  logger.access(big);
  logger.access(line(2));
  logger.access.flush();
  for (const w of shared.writes) assert.ok(Buffer.byteLength(w) <= PIPE_ATOMIC_BYTES, `a write of ${Buffer.byteLength(w)} bytes`);
  const lines = shared.writes.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(lines.map((l) => l.req_id), ['req-1', 'req-7', 'req-2']);
  const cut = lines[1]!;
  assert.equal(cut.truncated, true, 'the line says it was cut');
  for (const [field, whole] of Object.entries({ path: big.path, model: big.model, app_name: big.app_name, app_url: big.app_url, api_version: big.api_version })) {
    const v = cut[field] as string;
    assert.ok(whole!.startsWith(v.endsWith('\u2026') ? v.slice(0, -1) : v), `${field} keeps its start`);
    assert.ok(v.length >= 64, `${field} keeps at least 64 characters`);
  }
  assert.ok((cut.path as string).endsWith('\u2026'), 'the longest field is cut and marked');
  assert.equal(cut.key_id, 'k_1', 'the fields keyward sets are kept');
  assert.equal(cut.worker, 1);
  assert.equal(lines[0]!.app_name, 'é'.repeat(100), 'a line that fits is not cut');
  assert.equal(lines[0]!.truncated, undefined);

  const single = capture();
  const one = createLogger({ level: 'info', destination: single.destination });
  one.access(big);
  one.access.flush();
  const whole = JSON.parse(single.writes.join('').trim()) as Record<string, string>;
  assert.equal(whole.model, long('€', 256), 'nothing to interleave with: the line stays whole');
});

test("shared stdout: pino's own lines are cut to fit too (a reload error naming many long problems), still JSON", async () => {
  const shared = capture();
  const logger = createLogger({ level: 'info', destination: shared.destination, fields: { worker: 2 }, shared: true });
  const problems = Array.from({ length: 40 }, (_, i) => `routes.${i}.path: ${'x'.repeat(200)} is not a path`);
  logger.error({ problems, file: '/etc/keyward/keyward.yaml' }, 'config reload failed');
  logger.info({ short: 'ok' }, 'fits');
  await new Promise((r) => setImmediate(r));
  const lines = shared.writes.join('').split('\n').filter(Boolean);
  assert.equal(lines.length, 2);
  for (const l of lines) assert.ok(Buffer.byteLength(l) + 1 <= PIPE_ATOMIC_BYTES, `${Buffer.byteLength(l)} bytes`);
  const [err, fits] = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.equal(err!.msg, 'config reload failed');
  assert.equal(err!.truncated, true);
  assert.equal((err!.problems as string[]).length, 40, 'every problem is still named');
  assert.equal(err!.file, '/etc/keyward/keyward.yaml', 'short fields are kept whole');
  assert.equal(fits!.truncated, undefined);
});

test('the access line says "shadow" only when a shadowed check would have refused (DESIGN section 12)', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination });
  logger.access(line(1));
  logger.access({ ...line(2), shadow: ['rpm_exceeded', 'tpm_exceeded'] });
  logger.access.flush();
  const [plain, shadowed] = writes.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.equal('shadow' in plain!, false);
  assert.deepEqual(shadowed!.shadow, ['rpm_exceeded', 'tpm_exceeded']);
  assert.equal(shadowed!.msg, 'request');
  assert.equal(shadowed!.upstream_ms, 1);
});

test('every access line carries its own field values, whatever the line before it held', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination });
  const values = ['gpt-4o', 'gpt-4o', null, 'a "quoted" \\ model', 'gpt-4o', `gpt${'-4o'}`, '', 'ünï', null, null];
  const sent = values.map((v, i): AccessLine => ({ ...line(i), model: v, path: `/v1/${v ?? 'none'}`, key_id: v, code: i % 2 ? 'rpm_exceeded' : null, client_ip: v === null ? '10.0.0.1' : '127.0.0.1' }));
  for (const l of sent) logger.access(l);
  logger.access.flush();
  const got = writes.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.equal(got.length, sent.length);
  got.forEach((l, i) => {
    const s = sent[i]!;
    assert.deepEqual([l.model, l.path, l.key_id, l.code, l.client_ip], [s.model, s.path, s.key_id, s.code, s.client_ip], `line ${i}`);
  });
});
