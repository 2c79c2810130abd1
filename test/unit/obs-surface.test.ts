/**
 * What operators read from keyward's observability: the
 * mirrored gauges and counters on /metrics with their exact values (sentinels included),
 * the trace holder's swaps and its once-per-outage export warning, the OTEL_BSP_* bounds,
 * and the log lines' shape and secrecy.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { capture } from '../helpers/log-capture.js';
import { createMetrics, type MetricSources } from '../../src/obs/metrics.js';
import { createLogger, type AccessLine } from '../../src/obs/logger.js';
import { fitLine } from '../../src/obs/line-fit.js';
import { Traces, traceTuningFromEnv } from '../../src/obs/tracing/sink.js';
import type { RequestSpan, SinkEvents, SinkFactory, TraceSink, TracingConfig } from '../../src/obs/tracing/span.js';
import type { LogSink } from '../../src/log.js';

/** The value of the unlabelled series `name` in a Prometheus text, or undefined when absent. */
function valueOf(text: string, name: string): number | undefined {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

const limiter = { redisErrors: 3, failOpenAdmissions: 4, failOpenHolds: 5, slotsHeld: 6 };

test('metrics: the mirrored figures are on /metrics under their names, each with its own value', async () => {
  const sources: MetricSources = {
    replica: () => ({ version: 12, appliedAt: 10_000 }),
    limiter: () => limiter,
    sync: () => ({ currentAsOf: 40_000, connected: true }),
    usage: () => ({ buffered: 7, sent: 8, dropped: 9, rejected: 10 }),
    traces: () => ({ dropped: 11 }),
    now: () => 42_500,
  };
  const text = await createMetrics(sources).exposition.metrics();
  const expected: Record<string, number> = {
    keyward_replica_version: 12,
    // the later of the last apply (10 s) and the console's last word (40 s), seen at 42.5 s
    keyward_replica_sync_lag_seconds: 2.5,
    keyward_sync_connected: 1,
    keyward_redis_errors_total: 3,
    keyward_fail_open_admissions_total: 4,
    keyward_fail_open_holds_total: 5,
    keyward_slots_held: 6,
    keyward_usage_events_buffered: 7,
    keyward_usage_events_sent_total: 8,
    keyward_usage_events_dropped_total: 9,
    keyward_usage_events_rejected_total: 10,
    keyward_trace_spans_dropped_total: 11,
  };
  for (const [name, value] of Object.entries(expected)) assert.equal(valueOf(text, name), value, name);
  assert.match(text, /^# TYPE keyward_sync_connected gauge$/m);
  assert.match(text, /^# TYPE keyward_usage_events_sent_total counter$/m);
});

test('metrics: before any sync the replica version and the lag are -1; a lost console connection is 0', async () => {
  const text = await createMetrics({
    replica: () => ({ version: null, appliedAt: null }),
    limiter: () => limiter,
    sync: () => ({ currentAsOf: null, connected: false }),
    now: () => 42_500,
  }).exposition.metrics();
  assert.equal(valueOf(text, 'keyward_replica_version'), -1);
  assert.equal(valueOf(text, 'keyward_replica_sync_lag_seconds'), -1);
  assert.equal(valueOf(text, 'keyward_sync_connected'), 0);
  // without a usage pusher its series are not made; the dropped spans always are
  assert.equal(valueOf(text, 'keyward_usage_events_sent_total'), undefined);
  assert.equal(valueOf(text, 'keyward_trace_spans_dropped_total'), 0);
});

test('OTEL_BSP_*: zero is not a positive integer and is ignored', () => {
  assert.deepEqual(traceTuningFromEnv({ OTEL_BSP_SCHEDULE_DELAY: '0', OTEL_BSP_MAX_QUEUE_SIZE: '0', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '0' }), {});
});

/** A sink that closes at once and answers with the traceparent its config implies. */
class PlainSink implements TraceSink {
  constructor(readonly config: TracingConfig) {}
  start(): RequestSpan {
    return { traceparent: this.config.propagate ? 'tp' : null, end() {} };
  }
  async close(): Promise<void> {}
  abandon(): void {}
}

test('Traces: a reload that changes only propagate, or only sampleRatio, builds a new sink', async () => {
  const built: TracingConfig[] = [];
  const load = async (): Promise<SinkFactory> => ({ config }) => (built.push(config), new PlainSink(config));
  const traces = new Traces({ log: quietLog(), load });
  await traces.configure({ otlpUrl: 'http://a:4318', sampleRatio: 1, propagate: true });
  assert.equal(traces.start({})!.traceparent, 'tp');
  await traces.configure({ otlpUrl: 'http://a:4318', sampleRatio: 1, propagate: false });
  assert.equal(built.length, 2, 'propagate changed');
  assert.equal(traces.start({})!.traceparent, null, 'propagate: false applies to the next request');
  await traces.configure({ otlpUrl: 'http://a:4318', sampleRatio: 0.25, propagate: false });
  assert.equal(built.length, 3, 'sampleRatio changed');
  assert.equal(built[2]!.sampleRatio, 0.25);
  await traces.close(1_000);
});

function quietLog(): LogSink & { warned: { obj: object; msg?: string }[] } {
  const warned: { obj: object; msg?: string }[] = [];
  return { warned, debug() {}, info() {}, error() {}, warn: (obj, msg) => void warned.push({ obj, msg }) };
}

test('Traces: a failing export is logged once per outage, again after the collector answered once', async () => {
  let events!: SinkEvents;
  const load = async (): Promise<SinkFactory> => (o) => ((events = o.events), new PlainSink(o.config));
  const log = quietLog();
  const traces = new Traces({ log, load });
  await traces.configure({ otlpUrl: 'http://a:4318', sampleRatio: 1, propagate: true });
  for (let i = 0; i < 3; i++) events.dropped(2, 'export_failed', new Error('connection refused'));
  assert.equal(log.warned.length, 1, 'one line for the outage, not one per batch');
  assert.deepEqual(log.warned[0]!.obj, { spans: 2, err: 'connection refused' });
  events.exported();
  events.dropped(1, 'export_failed', new Error('again'));
  assert.equal(log.warned.length, 2, 'a new outage is logged again');
  // a full queue is counted, not logged
  events.dropped(5, 'queue_full');
  assert.equal(log.warned.length, 2);
  assert.equal(traces.stats().dropped, 2 * 3 + 1 + 5);
  await traces.close(1_000);
});


const line = (over: Partial<AccessLine> = {}): AccessLine => ({
  req_id: 'req-1', method: 'POST', path: '/v1/chat/completions', route: 'chat.completions', status: 200, code: null,
  key_id: 'k_1', key_kind: 'personal', project_id: 'p_1', user_id: 'u_1', model: 'gpt-4o-mini', routing: 'default',
  app_name: null, app_url: null, input_tokens: 10, output_tokens: 5, usage_estimated: false, client_ip: '127.0.0.1', api_version: null, duration_ms: 1.5, upstream_ms: 1, shadow: [],
  ...over,
});

const parsed = (writes: string[]) => writes.join('').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);

test('access line: a value holding only a double quote is still JSON and read back as sent', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination });
  logger.access(line({ model: 'a"b', app_name: '"', path: '/v1/"x"' }));
  logger.access.flush();
  const [l] = parsed(writes);
  assert.deepEqual([l!.model, l!.app_name, l!.path], ['a"b', '"', '/v1/"x"']);
});

test('access line: the level the request arrived under decides, not the level after a reload', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'warn', destination });
  logger.access(line({ req_id: 'arrived-under-info' }), true);
  logger.access(line({ req_id: 'level-now-warn' }));
  logger.level = 'info';
  logger.access(line({ req_id: 'arrived-under-warn' }), false);
  logger.access.flush();
  assert.deepEqual(parsed(writes).map((l) => l.req_id), ['arrived-under-info']);
});

test('pino lines and access lines share their shape: level, time, service, the extra fields', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination, fields: { worker: 2 } });
  logger.info({ n: 1 }, 'hello');
  logger.access(line());
  logger.access.flush();
  const [pinoLine, access] = parsed(writes);
  for (const l of [pinoLine!, access!]) {
    assert.deepEqual(Object.keys(l).slice(0, 4), ['level', 'time', 'service', 'worker']);
    assert.equal(l.service, 'keyward');
    assert.equal(l.level, 'info');
    assert.equal(l.worker, 2);
  }
});

test('a header object logged by mistake never prints its credentials', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination });
  const secret = 'sk-kw-0123456789abcdefSECRET';
  logger.warn({ headers: { authorization: `Bearer ${secret}`, 'x-api-key': secret }, key: secret, req: { authorization: secret, key: secret, headers: { authorization: `Bearer ${secret}`, 'x-api-key': secret } } }, 'oops');
  const text = writes.join('');
  assert.ok(text.length > 0);
  assert.ok(!text.includes(secret), text);
  assert.match(text, /\[redacted\]/);
});

test('a line cut to fit one pipe write keeps at least 64 characters of each string it cuts', () => {
  const problems = Array.from({ length: 40 }, (_, i) => `problem ${i} `.padEnd(120, 'x'));
  const line = `${JSON.stringify({ level: 'error', time: 't', service: 'keyward', problems, msg: 'config reload refused' })}\n`;
  assert.ok(Buffer.byteLength(line) > 4096);
  const out = fitLine(line, 4096);
  assert.ok(Buffer.byteLength(out) <= 4096);
  const got = JSON.parse(out) as { problems: string[]; truncated?: boolean; msg: string };
  assert.equal(got.truncated, true);
  assert.equal(got.msg, 'config reload refused');
  const cut = got.problems.filter((p, i) => p !== problems[i]);
  assert.ok(cut.length > 0, 'some strings were cut');
  got.problems.forEach((p, i) => {
    if (p === problems[i]) return;
    assert.equal(p, `${problems[i]!.slice(0, 64)}\u2026`, `problem ${i} keeps its first 64 characters`);
  });
});

test('access line: every field DESIGN section 9 names, under its name, with its own value, in pino\'s frame', () => {
  const { writes, destination } = capture();
  const logger = createLogger({ level: 'info', destination });
  // every field distinct, so a field written from another's value shows
  const sent = line({
    req_id: 'r-9', method: 'PUT', path: '/v1/files', route: 'files', status: 429, code: 'rpm_exceeded', key_id: 'k_9', key_kind: 'service',
    project_id: 'p_9', user_id: 'u_9', model: 'm-9', routing: 'east', app_name: 'App Nine', app_url: 'https://nine.example', input_tokens: 91,
    output_tokens: 92, usage_estimated: true, client_ip: '10.9.9.9', api_version: '2023-06-01', duration_ms: 9.125, upstream_ms: 4.5, shadow: ['tpm_exceeded'],
  });
  logger.access(sent);
  logger.access({ ...line(), usage_estimated: null, input_tokens: null, output_tokens: null, upstream_ms: null, key_kind: null, routing: null });
  logger.access.flush();
  const [full, nulls] = parsed(writes);
  const { level, time, service, msg, ...fields } = full!;
  assert.deepEqual([level, service, msg], ['info', 'keyward', 'request']);
  assert.match(String(time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.deepEqual(fields, { ...sent });
  assert.deepEqual(
    [nulls!.usage_estimated, nulls!.input_tokens, nulls!.output_tokens, nulls!.upstream_ms, nulls!.key_kind, nulls!.routing],
    [null, null, null, null, null, null],
  );
});
