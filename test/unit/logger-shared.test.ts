/**
 * Cluster workers share one stdout: every write must hold whole lines and stay within
 * what a pipe takes atomically, or lines of two workers could interleave.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import type pino from 'pino';
import { createLogger, PIPE_ATOMIC_BYTES, type AccessLine } from '../../src/obs/logger.js';

function capture(): { writes: string[]; destination: pino.DestinationStream } {
  const writes: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      writes.push(chunk.toString('utf8'));
      cb();
    },
  });
  return { writes, destination: destination as unknown as pino.DestinationStream };
}

const line = (i: number): AccessLine => ({
  req_id: `req-${i}`, method: 'POST', path: '/v1/chat/completions', route: 'chat.completions', status: 200, code: null,
  key_id: 'k_1', key_kind: 'personal', project_id: null, user_id: 'u_1', model: 'gpt-4o-mini', routing: 'default',
  app_name: 'é'.repeat(100), app_url: null, input_tokens: 10, output_tokens: 5, usage_estimated: false, client_ip: '127.0.0.1', api_version: null, duration_ms: 1.5, upstream_ms: 1,
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

test('shared stdout: a line over PIPE_ATOMIC_BYTES (long non-ASCII client fields) is clipped to fit one write; a single process keeps it whole', () => {
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
  const lines = shared.writes.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, string>);
  assert.deepEqual(lines.map((l) => l.req_id), ['req-1', 'req-7', 'req-2']);
  const clippedLine = lines[1]!;
  assert.equal(clippedLine.path, `/v1/${long('€', 60)}`, 'the path keeps its first 64 characters');
  assert.equal(clippedLine.model, long('€', 64));
  assert.equal(clippedLine.app_url, long('\u0001', 64));
  assert.equal(clippedLine.key_id, 'k_1', 'the fields keyward sets are kept');
  assert.equal(lines[0]!.app_name, 'é'.repeat(100), 'a line that fits is not clipped');

  const single = capture();
  const one = createLogger({ level: 'info', destination: single.destination });
  one.access(big);
  one.access.flush();
  const whole = JSON.parse(single.writes.join('').trim()) as Record<string, string>;
  assert.equal(whole.model, long('€', 256), 'nothing to interleave with: the line stays whole');
});
