/**
 * Traces' parts that need no network: the `tracing` config block, the outgoing header
 * lines with a traceparent to send, the OTEL_BSP_* environment, and the holder that swaps
 * one sink for another (DESIGN section 12) without losing a span in flight.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, parseConfigText } from '../../src/config/load.js';
import { configSchema } from '../../src/config/schema.js';
import { outgoingHeaders } from '../../src/proxy/upstream/header-lines.js';
import { quiet } from '../../src/log.js';
import { Traces, traceTuningFromEnv } from '../../src/obs/tracing/sink.js';
import type { RequestSpan, SinkFactory, SpanFacts, TraceSink, TracingConfig } from '../../src/obs/tracing/span.js';

const MINIMAL = 'upstreams:\n  default:\n    url: http://127.0.0.1:4000\n';
const parse = (text: string, env: Record<string, string> = {}) => parseConfigText({ text, file: 'kw.yaml', schema: configSchema, env });
function problems(text: string): string[] {
  try {
    parse(text);
  } catch (e) {
    assert.ok(e instanceof ConfigError);
    return e.problems;
  }
  return assert.fail('expected a ConfigError');
}

test('config: tracing is optional; its defaults are sampleRatio 1 and propagate true', () => {
  assert.equal(parse(MINIMAL).tracing, undefined);
  assert.deepEqual(parse(`${MINIMAL}tracing: { otlpUrl: http://collector:4318 }\n`).tracing, { otlpUrl: 'http://collector:4318', sampleRatio: 1, propagate: true });
  const env = { RATIO: '0.25', PROPAGATE: 'false' };
  assert.deepEqual(parse(`${MINIMAL}tracing: { otlpUrl: https://c.example/otlp, sampleRatio: \${RATIO}, propagate: \${PROPAGATE} }\n`, env).tracing, {
    otlpUrl: 'https://c.example/otlp', sampleRatio: 0.25, propagate: false,
  });
  assert.equal(parse(`${MINIMAL}tracing: { otlpUrl: http://c:4318, sampleRatio: 0 }\n`).tracing?.sampleRatio, 0);
});

test('config: tracing is strict, and every problem in it is reported', () => {
  const list = problems(`${MINIMAL}tracing: { otlpUrl: ftp://c, sampleRatio: 1.5, propagate: maybe, exporter: zipkin }\n`);
  for (const path of ['tracing.otlpUrl', 'tracing.sampleRatio', 'tracing.propagate']) assert.ok(list.some((p) => p.startsWith(`${path}:`)), `${path} in ${list.join('\n')}`);
  assert.ok(list.some((p) => /exporter/.test(p)), list.join('\n'));
  // Without otlpUrl: the collector beside keyward (DESIGN section 2's default).
  assert.equal(parse(`${MINIMAL}tracing: { sampleRatio: 0.5 }\n`).tracing?.otlpUrl, 'http://127.0.0.1:4318');
  assert.ok(problems(`${MINIMAL}tracing: { otlpUrl: http://c, sampleRatio: -0.1 }\n`).some((p) => p.startsWith('tracing.sampleRatio:')));
});

test('outgoing header lines: without a traceparent to send, nothing changes', () => {
  const raw = ['Host', 'a', 'traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'tracestate', 'a=1, b=2', 'X-Other', 'x'];
  assert.deepEqual({ ...outgoingHeaders(raw) }, { host: 'a', traceparent: raw[3], tracestate: 'a=1, b=2', 'x-other': 'x' });
});

test('outgoing header lines: the traceparent to send takes the first received one\'s place, once; tracestate is kept', () => {
  const mine = '00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01';
  const raw = ['Host', 'a', 'TraceParent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'tracestate', 'a=1', 'traceparent', 'junk', 'tracestate', 'b=2', 'X-Other', 'x'];
  const out = outgoingHeaders(raw, { traceparent: mine });
  assert.deepEqual(Object.entries(out), [['host', 'a'], ['traceparent', mine], ['tracestate', ['a=1', 'b=2']], ['x-other', 'x']]);
  // none received: sent as the last line
  assert.deepEqual(Object.entries(outgoingHeaders(['Host', 'a', 'Accept', '*/*'], { traceparent: mine })), [['host', 'a'], ['accept', '*/*'], ['traceparent', mine]]);
});

test('OTEL_BSP_* environment: positive integers tune the batch, anything else is ignored', () => {
  assert.deepEqual(traceTuningFromEnv({}), {});
  assert.deepEqual(traceTuningFromEnv({ OTEL_BSP_SCHEDULE_DELAY: '200', OTEL_BSP_MAX_QUEUE_SIZE: '4096', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '128' }), {
    scheduledDelayMs: 200, maxQueueSize: 4096, maxExportBatchSize: 128,
  });
  assert.deepEqual(traceTuningFromEnv({ OTEL_BSP_SCHEDULE_DELAY: '', OTEL_BSP_MAX_QUEUE_SIZE: '-1', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '1.5' }), {});
});

/** A sink that records what happens to its spans, so the holder's swaps can be watched. */
class RecordingSink implements TraceSink {
  readonly ended: SpanFacts[] = [];
  started = 0;
  closed = false;
  private open = 0;
  private idle: (() => void) | null = null;
  constructor(readonly config: TracingConfig) {}
  start(): RequestSpan {
    this.started++;
    this.open++;
    return {
      traceparent: this.config.propagate ? 'tp' : null,
      end: (facts) => {
        assert.equal(this.closed, false, 'a span ends before its sink closes');
        this.ended.push(facts);
        if (--this.open === 0) this.idle?.();
      },
    };
  }
  async close(): Promise<void> {
    if (this.open > 0) await new Promise<void>((r) => (this.idle = r));
    this.closed = true;
  }
  abandon(): void {}
}

const facts = (path: string): SpanFacts => ({
  routeClass: 'model', method: 'POST', path, status: 200, cut: null, route: null, code: null, keyId: null, projectId: null, model: null, shadow: [], decisionMs: null, inputTokens: null, outputTokens: null,
});

test('Traces: off until configured; a new tracing block replaces the sink, and the old one closes once its spans have ended', async () => {
  const sinks: RecordingSink[] = [];
  const load = async (): Promise<SinkFactory> => ({ config }) => {
    const s = new RecordingSink(config);
    sinks.push(s);
    return s;
  };
  const traces = new Traces({ log: quiet, load });
  assert.equal(traces.start({}), null, 'no span without tracing');
  await traces.configure({ otlpUrl: 'http://a:4318', sampleRatio: 1, propagate: true });
  const inFlight = traces.start({})!;
  assert.equal(inFlight.traceparent, 'tp');
  // The same settings again (a reload that left tracing alone) keep the sink.
  await traces.configure({ otlpUrl: 'http://a:4318', sampleRatio: 1, propagate: true });
  assert.equal(sinks.length, 1);
  await traces.configure({ otlpUrl: 'http://b:4318', sampleRatio: 0.5, propagate: false });
  assert.equal(sinks.length, 2);
  const after = traces.start({})!;
  assert.equal(after.traceparent, null, 'new requests follow the new block');
  assert.equal(sinks[0]!.closed, false, 'the old sink waits for its span in flight');
  inFlight.end(facts('/old'));
  await new Promise((r) => setImmediate(r));
  assert.equal(sinks[0]!.closed, true);
  assert.deepEqual(sinks[0]!.ended.map((f) => f.path), ['/old'], 'the span in flight ended on the sink it started on');
  after.end(facts('/new'));
  await traces.configure(undefined);
  assert.equal(traces.start({}), null, 'tracing removed: no spans');
  await new Promise((r) => setImmediate(r));
  assert.equal(sinks[1]!.closed, true);
  assert.deepEqual(sinks[1]!.ended.map((f) => f.path), ['/new']);
});

test('Traces: of two overlapping configure calls the later one wins', async () => {
  const built: string[] = [];
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let calls = 0;
  const load = async (): Promise<SinkFactory> => {
    // the first load is slow: the second configure call overtakes it
    if (calls++ === 0) await gate;
    return ({ config }) => {
      built.push(config.otlpUrl);
      return new RecordingSink(config);
    };
  };
  const traces = new Traces({ log: quiet, load });
  const first = traces.configure({ otlpUrl: 'http://first', sampleRatio: 1, propagate: true });
  await traces.configure({ otlpUrl: 'http://second', sampleRatio: 1, propagate: false });
  release();
  await first;
  assert.deepEqual(built, ['http://second']);
  assert.equal(traces.start({})!.traceparent, null);
});
