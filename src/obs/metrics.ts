/**
 * Prometheus metrics (DESIGN section 9). Counters the request path updates directly;
 * gauges read from the adapters at scrape time through the `sources` callbacks, so the
 * adapters stay free of metric code.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface MetricSources {
  replica: () => { version: number | null; appliedAt: number | null };
  limiter: () => { redisErrors: number; failOpenAdmissions: number; slotsHeld: number };
  sync?: () => { lastSyncAt: number | null; connected: boolean };
  usage?: () => { buffered: number; sent: number; dropped: number };
  now?: () => number;
}

export interface Metrics {
  registry: Registry;
  requests: Counter<'route' | 'status' | 'code'>;
  decisionSeconds: Histogram<'outcome'>;
  inFlight: Gauge;
}

export function createMetrics(sources: MetricSources): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'keyward_process_' });
  const now = sources.now ?? Date.now;
  const requests = new Counter({
    name: 'keyward_requests_total',
    help: 'Requests by route class name, status and denial code ("" when forwarded)',
    labelNames: ['route', 'status', 'code'] as const,
    registers: [registry],
  });
  const decisionSeconds = new Histogram({
    name: 'keyward_decision_seconds',
    help: 'Time from request arrival to allow/deny decision',
    labelNames: ['outcome'] as const,
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5],
    registers: [registry],
  });
  const inFlight = new Gauge({ name: 'keyward_in_flight_requests', help: 'Requests being handled', registers: [registry] });
  new Gauge({
    name: 'keyward_replica_version',
    help: 'Sync version of the replica (-1 before the first sync or import)',
    registers: [registry],
    collect() {
      this.set(sources.replica().version ?? -1);
    },
  });
  new Gauge({
    name: 'keyward_replica_sync_lag_seconds',
    help: 'Seconds since the replica last applied a snapshot or change batch, or heard from the console',
    registers: [registry],
    collect() {
      const last = Math.max(sources.replica().appliedAt ?? 0, sources.sync?.().lastSyncAt ?? 0);
      this.set(last === 0 ? -1 : (now() - last) / 1000);
    },
  });
  const fromSource = (kind: 'gauge' | 'counter', name: string, help: string, read: () => number) => {
    if (kind === 'gauge') {
      new Gauge({ name, help, registers: [registry], collect() { this.set(read()); } });
    } else {
      // The adapter owns the running total; the counter mirrors it at scrape time.
      new Counter({ name, help, registers: [registry], collect() { this.reset(); this.inc(read()); } });
    }
  };
  fromSource('counter', 'keyward_redis_errors_total', 'Redis errors and timeouts seen by the limiter', () => sources.limiter().redisErrors);
  fromSource('counter', 'keyward_fail_open_admissions_total', 'Requests admitted by the in-process limiter because Redis failed', () => sources.limiter().failOpenAdmissions);
  fromSource('gauge', 'keyward_slots_held', 'Concurrency slots this instance holds', () => sources.limiter().slotsHeld);
  const usage = sources.usage;
  if (usage) {
    fromSource('gauge', 'keyward_usage_events_buffered', 'Usage events waiting to be sent to the console', () => usage().buffered);
    fromSource('counter', 'keyward_usage_events_sent_total', 'Usage events sent to the console', () => usage().sent);
    fromSource('counter', 'keyward_usage_events_dropped_total', 'Usage events dropped because the buffer was full', () => usage().dropped);
  }
  return { registry, requests, decisionSeconds, inFlight };
}
