/**
 * A reload that points tracing at another collector while a stream runs, then a shutdown:
 * the stream's span ends on the tracer it started on (replaced by then), when the shutdown
 * grace cuts it. That tracer's last export gets the same deadline as the one in force, and
 * what it cannot send by then is counted in keyward_trace_spans_dropped_total and logged
 * (DESIGN section 13), not lost without a word when the process exits. Real sidecar, fake
 * upstream, a collector that never answers and one that does.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { once } from 'node:events';
import net from 'node:net';
import { configSchema } from '../../src/config/schema.js';
import { startFakeUpstream } from '../helpers/upstream.js';
import { startHarness } from '../helpers/sidecar.js';
import { startOtlpReceiver } from '../helpers/otlp-receiver.js';

test('a span left on a replaced tracer whose collector hangs at shutdown is counted as dropped, and logged', { timeout: 30_000 }, async () => {
  const stalled = createServer(() => {}); // takes the export, never answers
  stalled.listen(0, '127.0.0.1');
  await once(stalled, 'listening');
  const rx = await startOtlpReceiver();
  // an endless stream: the shutdown grace cuts it
  const up = await startFakeUpstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: {}\n\n');
  });
  try {
    // its export outlasts the 2 s shutdown deadline
    const first = { otlpUrl: `http://127.0.0.1:${(stalled.address() as net.AddressInfo).port}` };
    const h = await startHarness({ upstream: up.url, keys: { k: {} }, config: { tracing: first }, traceTuning: { scheduledDelayMs: 20, exportTimeoutMs: 4_000 } });
    const s = net.connect(Number(new URL(h.url).port), '127.0.0.1');
    s.on('error', () => {});
    const body = JSON.stringify({ model: 'gpt-4o-mini', stream: true, messages: [] });
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${h.keys.k}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    await once(s, 'data');
    // a reload: the next requests trace to the collector that answers
    await h.sidecar.reconfigure(configSchema.parse({ ...h.config, tracing: { otlpUrl: rx.url } }));
    const exporting = once(stalled, 'request');
    await h.close(); // grace 500 ms, then the stream is cut and its span ends on the first tracer
    s.destroy();
    await exporting;
    assert.equal(h.sidecar.traces.stats().dropped, 1, 'the span the stalled collector never took is counted');
    assert.ok(h.logs.some((l) => l.includes('trace export not done when the shutdown deadline came')), 'and logged');
    assert.equal(rx.spans.length, 0);
  } finally {
    stalled.closeAllConnections();
    stalled.close();
    await up.close();
    await rx.close();
  }
});
