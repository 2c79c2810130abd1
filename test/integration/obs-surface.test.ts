/**
 * What operators see of observability, with real parts: the OTLP export to a
 * local receiver when the configured URL ends in a slash, the admin listener's answers
 * (/readyz's body, a query on a probe, a method it does not serve), and access lines still
 * held when a process exits without flushing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { startAdmin } from '../../src/obs/admin.js';
import { Traces } from '../../src/obs/tracing/sink.js';
import type { SpanFacts } from '../../src/obs/tracing/span.js';
import { quiet } from '../../src/log.js';
import { startOtlpReceiver } from '../helpers/otlp-receiver.js';

const facts: SpanFacts = {
  routeClass: 'listing', method: 'GET', path: '/v1/models', status: 200, cut: null, route: 'models', code: null, keyId: 'k_1', projectId: null,
  model: null, shadow: [], decisionMs: 0.5, inputTokens: null, outputTokens: null,
};

test('tracing.otlpUrl with a trailing slash: spans still go to <otlpUrl>/v1/traces', async () => {
  const rx = await startOtlpReceiver();
  const traces = new Traces({ log: quiet, tuning: { scheduledDelayMs: 20 } });
  try {
    await traces.configure({ otlpUrl: `${rx.url}/`, sampleRatio: 1, propagate: true });
    traces.start({})!.end(facts);
    await traces.close(5_000);
    assert.deepEqual(rx.spans.map((s) => s.name), ['keyward listing']);
    assert.equal(traces.stats().dropped, 0);
  } finally {
    await rx.close();
  }
});

test('a span in flight when tracing is reloaded or shut down still reaches its collector', async () => {
  const first = await startOtlpReceiver();
  const second = await startOtlpReceiver();
  const traces = new Traces({ log: quiet, tuning: { scheduledDelayMs: 20 } });
  try {
    await traces.configure({ otlpUrl: first.url, sampleRatio: 1, propagate: true });
    const inFlight = traces.start({})!;
    // a reload points tracing elsewhere while the request is still running
    await traces.configure({ otlpUrl: second.url, sampleRatio: 1, propagate: true });
    inFlight.end({ ...facts, path: '/in-flight' });
    await first.waitFor((s) => s.attributes['url.path'] === '/in-flight', 5_000);
    // shutdown with a request still running: the close waits for it (within its deadline)
    const running = traces.start({})!;
    const closing = traces.close(5_000);
    running.end({ ...facts, path: '/at-shutdown' });
    await closing;
    assert.deepEqual(second.spans.map((s) => s.attributes['url.path']), ['/at-shutdown']);
    assert.equal(traces.stats().dropped, 0);
  } finally {
    await first.close();
    await second.close();
  }
});

test('admin: /readyz says why it is not ready; probes with a query answer as without; other methods get 405', async () => {
  let reason: string | null = 'replica not loaded: no sync or import yet';
  const exposition = { contentType: 'text/plain; version=0.0.4; charset=utf-8' as const, metrics: async () => 'keyward_x 1\n' };
  const admin = await startAdmin({ host: '127.0.0.1', port: 0, exposition, notReadyReason: () => reason });
  const base = `http://127.0.0.1:${admin.port}`;
  try {
    const notReady = await fetch(`${base}/readyz`);
    assert.equal(notReady.status, 503);
    assert.deepEqual(await notReady.json(), { status: 'not_ready', reason: 'replica not loaded: no sync or import yet' });
    reason = null;
    const ready = await fetch(`${base}/readyz?probe=kubelet`);
    assert.equal(ready.status, 200);
    assert.deepEqual(await ready.json(), { status: 'ready' });
    const health = await fetch(`${base}/healthz?x=1`);
    assert.equal(health.status, 200);
    assert.deepEqual(await health.json(), { status: 'ok' });
    const metrics = await fetch(`${base}/metrics?name[]=keyward_x`);
    assert.equal(metrics.status, 200);
    assert.equal(metrics.headers.get('content-type'), exposition.contentType);
    assert.equal(await metrics.text(), 'keyward_x 1\n');
    const head = await fetch(`${base}/healthz`, { method: 'HEAD' });
    assert.equal(head.status, 200);
    for (const method of ['POST', 'PUT', 'DELETE']) {
      const res = await fetch(`${base}/healthz`, { method });
      assert.equal(res.status, 405, method);
      assert.deepEqual(await res.json(), { error: 'method not allowed' });
    }
    const missing = await fetch(`${base}/nothing`);
    assert.equal(missing.status, 404);
    await missing.arrayBuffer();
  } finally {
    await admin.close();
  }
});

test('access lines still held when a process exits without flushing are written', { timeout: 30_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-obs-exit-'));
  const logger = pathToFileURL(join(import.meta.dirname, '../../src/obs/logger.ts')).href;
  const main = join(dir, 'main.ts');
  // Lines held for their batch (a few ms), then an exit in the same turn: nothing flushes them but the exit hook.
  writeFileSync(main, [
    `import { createLogger } from ${JSON.stringify(logger)};`,
    `const logger = createLogger({ level: 'info' });`,
    `for (let i = 0; i < 3; i++) logger.access({ req_id: 'held-' + i, method: 'GET', path: '/v1/models', route: 'models', status: 200, code: null,`,
    `  key_id: null, key_kind: null, project_id: null, user_id: null, model: null, routing: null, app_name: null, app_url: null, input_tokens: null,`,
    `  output_tokens: null, usage_estimated: null, client_ip: null, api_version: null, duration_ms: 1, upstream_ms: null, shadow: [] });`,
    `process.exit(0);`,
  ].join('\n'));
  try {
    const child = spawn(process.execPath, ['--import', 'tsx', main], { stdio: ['ignore', 'pipe', 'inherit'], cwd: join(import.meta.dirname, '../..') });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    const [code] = (await once(child, 'close')) as [number | null];
    assert.equal(code, 0);
    const ids = out.split('\n').filter(Boolean).map((l) => (JSON.parse(l) as { req_id?: string }).req_id);
    assert.deepEqual(ids, ['held-0', 'held-1', 'held-2']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
