/**
 * Prometheus metrics (DESIGN section 9). Request counts are plain numbers that prom-client
 * reads at scrape time through `collect()`; gauges of the adapters are read the same way,
 * through `sources`, so the adapters stay free of metric code.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface MetricSources {
  replica: () => { version: number | null; appliedAt: number | null };
  limiter: () => { redisErrors: number; failOpenAdmissions: number; slotsHeld: number };
  sync?: () => { lastSyncAt: number | null; connected: boolean };
  usage?: () => { buffered: number; sent: number; dropped: number };
  inFlight?: () => number;
  now?: () => number;
}

export interface Metrics {
  registry: Registry;
  /** one finished request */
  request(route: string, status: number, code: string): void;
  /** seconds from arrival to allow/deny */
  decision(outcome: 'allow' | 'deny', seconds: number): void;
}

export function createMetrics(sources: MetricSources): Metrics {
  const registry = new Registry();
  // prom-client's names already start with process_ or nodejs_: keyward_process_cpu_seconds_total, not keyward_process_process_….
  collectDefaultMetrics({ register: registry, prefix: 'keyward_' });
  const now = sources.now ?? Date.now;

  const requestCounts = new Map<string, number>();
  new Counter({
    name: 'keyward_requests_total',
    help: 'Requests by route name, status and denial code ("" when forwarded)',
    labelNames: ['route', 'status', 'code'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const [k, n] of requestCounts) {
        const [route, status, code] = k.split('\u0000') as [string, string, string];
        this.inc({ route, status, code }, n);
      }
    },
  });

  const decisions = new Histogram({
    name: 'keyward_decision_seconds',
    help: 'Time from request arrival to the allow/deny decision',
    labelNames: ['outcome'] as const,
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5],
    registers: [registry],
  });
  // One child per outcome, made once rather than a labels object per request.
  const byOutcome = { allow: decisions.labels({ outcome: 'allow' }), deny: decisions.labels({ outcome: 'deny' }) };

  const fromSource = (kind: 'gauge' | 'counter', name: string, help: string, read: () => number) => {
    if (kind === 'gauge') {
      new Gauge({ name, help, registers: [registry], collect() { this.set(read()); } });
    } else {
      // The adapter owns the running total; the counter mirrors it at scrape time.
      new Counter({ name, help, registers: [registry], collect() { this.reset(); this.inc(read()); } });
    }
  };
  if (sources.inFlight) fromSource('gauge', 'keyward_in_flight_requests', 'Requests being handled', sources.inFlight);
  fromSource('gauge', 'keyward_replica_version', 'Sync version of the replica (-1 before the first sync or import)', () => sources.replica().version ?? -1);
  fromSource('gauge', 'keyward_replica_sync_lag_seconds', 'Seconds since the replica last applied a snapshot or change batch, or heard from the console (-1: never)', () => {
    const last = Math.max(sources.replica().appliedAt ?? 0, sources.sync?.().lastSyncAt ?? 0);
    return last === 0 ? -1 : (now() - last) / 1000;
  });
  if (sources.sync) {
    const sync = sources.sync;
    fromSource('gauge', 'keyward_sync_connected', '1 when the last exchange with the console succeeded', () => (sync().connected ? 1 : 0));
  }
  fromSource('counter', 'keyward_redis_errors_total', 'Redis errors and timeouts seen by the limiter', () => sources.limiter().redisErrors);
  fromSource('counter', 'keyward_fail_open_admissions_total', 'Requests admitted by the in-process limiter because Redis failed', () => sources.limiter().failOpenAdmissions);
  fromSource('gauge', 'keyward_slots_held', 'Concurrency slots this instance holds', () => sources.limiter().slotsHeld);
  const usage = sources.usage;
  if (usage) {
    fromSource('gauge', 'keyward_usage_events_buffered', 'Usage events waiting to be sent to the console', () => usage().buffered);
    fromSource('counter', 'keyward_usage_events_sent_total', 'Usage events sent to the console', () => usage().sent);
    fromSource('counter', 'keyward_usage_events_dropped_total', 'Usage events dropped because the buffer was full', () => usage().dropped);
  }

  return {
    registry,
    request(route, status, code) {
      const k = `${route}\u0000${status}\u0000${code}`;
      requestCounts.set(k, (requestCounts.get(k) ?? 0) + 1);
    },
    decision(outcome, seconds) {
      byOutcome[outcome].observe(seconds);
    },
  };
}
