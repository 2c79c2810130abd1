/**
 * The decision histogram is counted in plain numbers and written by keyward
 * (src/obs/decision-histogram.ts). These tests hold what it writes to what a plain
 * prom-client Histogram fed the same observations writes, alone and added up across
 * workers, so a change to how it is kept, or a prom-client upgrade, that alters what a
 * scrape shows fails here, not in a dashboard.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AggregatorRegistry, Histogram, Registry } from 'prom-client';
import { addCounts, decisionText } from '../../src/obs/decision-histogram.js';
import { createMetrics } from '../../src/obs/metrics.js';

const sources = {
  replica: () => ({ version: 7, appliedAt: 1_000 }),
  limiter: () => ({ redisErrors: 0, failOpenAdmissions: 0, failOpenHolds: 0, slotsHeld: 0 }),
  now: () => 2_000,
};

function reference(): { registry: Registry; hist: Histogram<'outcome'> } {
  const registry = new Registry();
  const hist = new Histogram({
    name: 'keyward_decision_seconds',
    help: 'Time from request arrival to the allow/deny decision',
    labelNames: ['outcome'] as const,
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5],
    registers: [registry],
  });
  return { registry, hist };
}

// On a bound, between bounds, under the first and past the last (+Inf only).
const ROUND_1: ['allow' | 'deny', number][] = [
  ['allow', 0.00005], ['allow', 0.0001], ['allow', 0.0003], ['allow', 0.0003], ['deny', 0.002], ['allow', 0.7], ['deny', 0.5],
];
const ROUND_2: ['allow' | 'deny', number][] = [['allow', 0.01], ['deny', 0.00002], ['allow', 3]];

test('the decision histogram scrapes exactly as a prom-client histogram fed the same values, across scrapes', async () => {
  const m = createMetrics(sources);
  const ref = reference();
  const scrape = async () => [decisionText(m.decisionCounts()), await ref.registry.getSingleMetricAsString('keyward_decision_seconds')];
  const [empty] = await scrape();
  assert.doesNotMatch(empty!, /outcome=/, 'no label set before the first decision');
  for (const round of [ROUND_1, ROUND_2]) {
    for (const [outcome, s] of round) {
      m.decision(outcome, s);
      ref.hist.observe({ outcome }, s);
    }
    const [ours, theirs] = await scrape();
    assert.equal(ours, theirs);
  }
  // A scrape with nothing new changes nothing (the folded counts are not added twice).
  const [again, theirs] = await scrape();
  assert.equal(again, theirs);
  assert.match(again!, /keyward_decision_seconds_count\{outcome="allow"\} 7/);
  assert.match(again!, /keyward_decision_seconds_bucket\{le="\+Inf",outcome="deny"\} 3/);
  // What /metrics serves: the registry's metrics, then the histogram, each block apart.
  const served = await m.exposition.metrics();
  assert.ok(served.endsWith(`\n\n${again}\n`), 'the histogram closes the exposition');
  assert.match(served, /^# TYPE keyward_requests_total counter$/m);
  assert.equal(m.exposition.contentType, m.registry.contentType);
});

test('workers\' decision histograms add up as prom-client adds up their histograms', async () => {
  const [w1, w2] = [createMetrics(sources), createMetrics(sources)];
  const [r1, r2] = [reference(), reference()];
  for (const [outcome, s] of ROUND_1) {
    w1.decision(outcome, s);
    r1.hist.observe({ outcome }, s);
  }
  for (const [outcome, s] of [...ROUND_2, ...ROUND_1.slice(2)]) {
    w2.decision(outcome, s);
    r2.hist.observe({ outcome }, s);
  }
  const theirs = AggregatorRegistry.aggregate([await r1.registry.getMetricsAsJSON(), await r2.registry.getMetricsAsJSON()]);
  assert.equal(decisionText(addCounts([w1.decisionCounts(), w2.decisionCounts(), []])), await theirs.getSingleMetricAsString('keyward_decision_seconds'));
});

test('requests are counted by route, status and code', async () => {
  const m = createMetrics(sources);
  m.request('chat', 200, '');
  m.request('chat', 200, '');
  m.request('chat', 429, 'rpm_exceeded');
  const text = await m.registry.getSingleMetricAsString('keyward_requests_total');
  assert.match(text, /keyward_requests_total\{route="chat",status="200",code=""\} 2/);
  assert.match(text, /keyward_requests_total\{route="chat",status="429",code="rpm_exceeded"\} 1/);
  // scraped twice: the same totals, not doubled
  assert.equal(await m.registry.getSingleMetricAsString('keyward_requests_total'), text);
});

test('request counts: series that alternate, return and differ in one label each are counted apart', async () => {
  const m = createMetrics(sources);
  const calls: [string, number, string][] = [
    ['chat', 200, ''], ['chat', 200, ''], ['messages', 200, ''], ['chat', 200, ''], ['chat', 429, 'rpm_exceeded'],
    ['chat', 429, 'tpm_exceeded'], ['chat', 429, 'rpm_exceeded'], ['chat', 200, ''], ['messages', 200, ''], ['chat', 502, ''],
  ];
  for (const [route, status, code] of calls) m.request(route, status, code);
  const text = await m.registry.getSingleMetricAsString('keyward_requests_total');
  const want = new Map<string, number>();
  for (const [route, status, code] of calls) {
    const k = `keyward_requests_total{route="${route}",status="${status}",code="${code}"}`;
    want.set(k, (want.get(k) ?? 0) + 1);
  }
  const got = text.split('\n').filter((l) => l.startsWith('keyward_requests_total{'));
  assert.deepEqual(got.sort(), [...want].map(([k, n]) => `${k} ${n}`).sort());
});

test('the in-flight gauge is added once its source exists, and reads it at each scrape', async () => {
  const m = createMetrics(sources);
  assert.equal(m.registry.getSingleMetric('keyward_in_flight_requests'), undefined);
  let inFlight = 3;
  m.trackInFlight(() => inFlight);
  assert.match(await m.registry.getSingleMetricAsString('keyward_in_flight_requests'), /^keyward_in_flight_requests 3$/m);
  inFlight = 0;
  assert.match(await m.registry.getSingleMetricAsString('keyward_in_flight_requests'), /^keyward_in_flight_requests 0$/m);
});

test('shadow denials are counted by code, each code of a request once', async () => {
  const m = createMetrics(sources);
  m.shadowDenials(['rpm_exceeded']);
  m.shadowDenials(['rpm_exceeded', 'tpm_exceeded']);
  const text = await m.registry.getSingleMetricAsString('keyward_shadow_denials_total');
  assert.match(text, /keyward_shadow_denials_total\{code="rpm_exceeded"\} 2/);
  assert.match(text, /keyward_shadow_denials_total\{code="tpm_exceeded"\} 1/);
  assert.equal(await m.registry.getSingleMetricAsString('keyward_shadow_denials_total'), text);
});
