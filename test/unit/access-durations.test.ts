/**
 * The access line's `duration_ms` and `upstream_ms` are written from integers, not by
 * JavaScript's number formatting: the text must be what `String` (and so JSON) gives.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import type pino from 'pino';
import { createLogger, msText, type AccessLine } from '../../src/obs/logger.js';

test('msText writes a duration rounded to µs as String does: every µs up to 2 s, then steps of 997 µs up to an hour', () => {
  for (let us = 0; us <= 3_600_000_000; us += us < 2_000_000 ? 1 : 997) {
    const ms = Math.round((us / 1000) * 1000) / 1000;
    if (msText(ms) !== String(ms)) assert.fail(`${us} µs: ${msText(ms)} against ${String(ms)}`);
  }
});

test('msText leaves to String what it does not make: null, negatives, more digits, past 23 days, non-finite', () => {
  assert.equal(msText(null), 'null');
  for (const ms of [-1.5, 0.0001, 1.23456, 1e-7, 2_500_000_000.5, 1e21, Number.NaN, Infinity, 0.1 + 0.2]) assert.equal(msText(ms), String(ms));
  assert.equal(msText(0), '0');
  assert.equal(msText(0.005), '0.005');
  assert.equal(msText(12.05), '12.05');
  assert.equal(msText(7.1), '7.1');
});

test('an access line carries both durations as JSON numbers with their µs', () => {
  const writes: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      writes.push(chunk.toString('utf8'));
      cb();
    },
  }) as unknown as pino.DestinationStream;
  const logger = createLogger({ level: 'info', destination });
  const base: AccessLine = {
    req_id: 'r', method: 'POST', path: '/v1/chat/completions', route: 'chat.completions', status: 200, code: null,
    key_id: null, key_kind: null, project_id: null, user_id: null, model: null, routing: null, app_name: null, app_url: null,
    input_tokens: null, output_tokens: null, usage_estimated: null, client_ip: null, api_version: null, duration_ms: 0, upstream_ms: null, shadow: [],
  };
  logger.access({ ...base, duration_ms: 1.05, upstream_ms: 0.007 });
  logger.access({ ...base, duration_ms: 250, upstream_ms: null });
  logger.access.flush();
  const lines = writes.join('').split('\n').filter(Boolean);
  assert.match(lines[0]!, /"duration_ms":1\.05,"upstream_ms":0\.007,/);
  assert.match(lines[1]!, /"duration_ms":250,"upstream_ms":null,/);
  const parsed = lines.map((l) => JSON.parse(l) as { duration_ms: number; upstream_ms: number | null });
  assert.deepEqual(parsed.map((l) => [l.duration_ms, l.upstream_ms]), [[1.05, 0.007], [250, null]]);
});
