/**
 * Prometheus metrics (DESIGN section 9). Request counts are plain numbers that prom-client
 * reads at scrape time through `collect()`; gauges of the adapters are read the same way,
 * through `sources`, so the adapters stay free of metric code. The decision histogram is
 * kept and written by decision-histogram.ts, after the registry's own metrics.
 */
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { DecisionHistogram, decisionText, type DecisionCounts, type Outcome } from './decision-histogram.js';

export interface MetricSources {
  replica: () => { version: number | null; appliedAt: number | null };
  limiter: () => { redisErrors: number; failOpenAdmissions: number; failOpenHolds: number; slotsHeld: number };
  sync?: () => { currentAsOf: number | null; connected: boolean };
  usage?: () => { buffered: number; sent: number; dropped: number; rejected: number };
  /** the tracer's lost spans (DESIGN section 13); absent: none are made here */
  traces?: () => { dropped: number };
  /** budget alerts delivered and given up (DESIGN section 13); absent: none are sent here */
  alerts?: () => { sent: number; failed: number };
  now?: () => number;
}

/** The config file in force and its reloads (DESIGN section 12). */
export interface ConfigStatus {
  reloads: { ok: number; error: number };
  /** ms since the epoch: the start, then each reload that succeeded */
  lastSuccessAt: number;
  /** sha256 of the file in force, first 12 hex digits */
  hash: string;
  /** settings of that file the process does not run yet: they need a restart */
  restartPending: number;
}

/** What /metrics serves: the registry's metrics and the decision histogram, as one text. */
export interface Exposition {
  readonly contentType: Registry['contentType'];
  metrics(): Promise<string>;
}

/** The registry's text (prom-client's Prometheus format, ending in a newline) with the decision histogram after it. */
export async function withDecisions(registry: Registry, counts: DecisionCounts): Promise<string> {
  return `${await registry.metrics()}\n${decisionText(counts)}\n`;
}

export interface Metrics {
  /** every metric but keyward_decision_seconds */
  registry: Registry;
  /** what /metrics serves */
  exposition: Exposition;
  /** keyward_decision_seconds so far, for a `serve --workers N` primary to add up */
  decisionCounts(): DecisionCounts;
  /** one finished request */
  request(route: string, status: number, code: string): void;
  /** seconds from arrival to allow/deny */
  decision(outcome: Outcome, seconds: number): void;
  /** one request's would-be refusals by shadowed checks, each code once (DESIGN section 12) */
  shadowDenials(codes: readonly string[]): void;
  /**
   * Adds the in-flight gauge, read from `read` at scrape time. Separate from the sources:
   * what counts requests in flight (the exchanges) is built after, and with, these metrics.
   */
  trackInFlight(read: () => number): void;
  /** Adds the config metrics, read from `read` at scrape time: only where the config file is read. */
  trackConfig(read: () => ConfigStatus): void;
}

/**
 * A gauge or counter that mirrors a figure an adapter keeps, read at scrape time. For a
 * counter the adapter owns the running total; the counter is set to it on each scrape.
 */
function mirror(registry: Registry, kind: 'gauge' | 'counter', name: string, help: string, read: () => number): void {
  if (kind === 'gauge') {
    new Gauge({ name, help, registers: [registry], collect() { this.set(read()); } });
  } else {
    new Counter({ name, help, registers: [registry], collect() { this.reset(); this.inc(read()); } });
  }
}

/** One series of keyward_requests_total, counted in a plain number. */
interface RequestSeries {
  route: string;
  status: number;
  code: string;
  n: number;
}

/**
 * keyward_requests_total, counted in plain numbers and handed over at scrape time. Most
 * requests fall in the series of the request before them (the same route constant, status
 * and code), which is then found without building or hashing a joined key.
 */
function requestCounts(registry: Registry): (route: string, status: number, code: string) => void {
  const series = new Map<string, RequestSeries>();
  let last: RequestSeries | null = null;
  new Counter({
    name: 'keyward_requests_total',
    help: 'Requests by route name, status and denial code ("" when forwarded)',
    labelNames: ['route', 'status', 'code'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const s of series.values()) this.inc({ route: s.route, status: String(s.status), code: s.code }, s.n);
    },
  });
  return (route, status, code) => {
    if (last === null || last.route !== route || last.status !== status || last.code !== code) {
      const k = `${route}\u0000${status}\u0000${code}`;
      last = series.get(k) ?? null;
      if (last === null) series.set(k, (last = { route, status, code, n: 0 }));
    }
    last.n++;
  };
}

/** keyward_shadow_denials_total, counted in a plain map by code and handed over at scrape time. */
function shadowCounts(registry: Registry): Map<string, number> {
  const counts = new Map<string, number>();
  new Counter({
    name: 'keyward_shadow_denials_total',
    help: 'Forwarded requests a shadowed check would have refused, by the code it would have answered (DESIGN section 12)',
    labelNames: ['code'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const [code, n] of counts) this.inc({ code }, n);
    },
  });
  return counts;
}

/** The adapters' figures: replica, sync, limiter, usage pusher and tracer. */
function mirrorSources(registry: Registry, sources: MetricSources): void {
  const now = sources.now ?? Date.now;
  const { replica, limiter, sync, usage, traces } = sources;
  mirror(registry, 'gauge', 'keyward_replica_version', 'Sync version of the replica (-1 before the first sync or import)', () => replica().version ?? -1);
  mirror(registry, 'gauge', 'keyward_replica_sync_lag_seconds', 'Seconds since the replica was last known current: it applied a snapshot or change batch, the console answered, or a long poll is held open (-1: never)', () => {
    const last = Math.max(replica().appliedAt ?? 0, sync?.().currentAsOf ?? 0);
    return last === 0 ? -1 : (now() - last) / 1000;
  });
  if (sync) mirror(registry, 'gauge', 'keyward_sync_connected', '1 when the last exchange with the console succeeded', () => (sync().connected ? 1 : 0));
  mirror(registry, 'counter', 'keyward_redis_errors_total', 'Redis errors and timeouts seen by the limiter', () => limiter().redisErrors);
  mirror(registry, 'counter', 'keyward_fail_open_admissions_total', 'Requests admitted by the in-process limiter because Redis failed', () => limiter().failOpenAdmissions);
  mirror(registry, 'counter', 'keyward_fail_open_holds_total', 'Spend holds taken by the in-process ledger because Redis failed', () => limiter().failOpenHolds);
  mirror(registry, 'gauge', 'keyward_slots_held', 'Concurrency slots this instance holds', () => limiter().slotsHeld);
  if (usage) {
    mirror(registry, 'gauge', 'keyward_usage_events_buffered', 'Usage events waiting to be sent to the console', () => usage().buffered);
    mirror(registry, 'counter', 'keyward_usage_events_sent_total', 'Usage events sent to the console', () => usage().sent);
    mirror(registry, 'counter', 'keyward_usage_events_dropped_total', 'Usage events dropped because the buffer was full', () => usage().dropped);
    mirror(registry, 'counter', 'keyward_usage_events_rejected_total', 'Usage events the console refused for good (a 4xx answer): not retried, not billed', () => usage().rejected);
  }
  // Always there (0 without tracing), so a dashboard panel and an alert on it never go blank.
  mirror(registry, 'counter', 'keyward_trace_spans_dropped_total', 'Trace spans that never reached the collector: the export queue was full or the export failed', () => traces?.().dropped ?? 0);
  alertCounts(registry, sources.alerts);
}

/** keyward_alerts_total{result}: both series always there (0 without alerts), as the dropped spans are. */
function alertCounts(registry: Registry, alerts: MetricSources['alerts']): void {
  new Counter({
    name: 'keyward_alerts_total',
    help: 'Budget alert events: sent (the webhook answered 2xx) or failed (given up after the retry window, or dropped)',
    labelNames: ['result'] as const,
    registers: [registry],
    collect() {
      const n = alerts?.() ?? { sent: 0, failed: 0 };
      this.reset();
      this.inc({ result: 'sent' }, n.sent);
      this.inc({ result: 'failed' }, n.failed);
    },
  });
}

/**
 * keyward_config_*: reloads by result (both series from the start), the last success, and
 * the hash in force as an info metric with one series, so the previous hash's goes away.
 */
function configMetrics(registry: Registry, read: () => ConfigStatus): void {
  new Counter({
    name: 'keyward_config_reloads_total',
    help: 'Config reloads (SIGHUP or a change of the file) by result: ok, or error when the file was refused and the running config kept',
    labelNames: ['result'] as const,
    registers: [registry],
    collect() {
      const { reloads } = read();
      this.reset();
      this.inc({ result: 'ok' }, reloads.ok);
      this.inc({ result: 'error' }, reloads.error);
    },
  });
  mirror(registry, 'gauge', 'keyward_config_last_reload_success_timestamp_seconds', 'When the config in force was loaded: the start, or the last reload that succeeded (seconds since the epoch)', () => read().lastSuccessAt / 1000);
  mirror(registry, 'gauge', 'keyward_config_restart_pending', 'Settings of the config file in force that wait for a restart (server.host/port, admin, replica, redis, console, keys): 0 when the process runs the whole file', () => read().restartPending);
  new Gauge({
    name: 'keyward_config_info',
    help: 'The config file in force: hash is the first 12 hex digits of its sha256',
    labelNames: ['hash'] as const,
    registers: [registry],
    collect() {
      this.reset();
      this.set({ hash: read().hash }, 1);
    },
  });
}

export function createMetrics(sources: MetricSources): Metrics {
  const registry = new Registry();
  // prom-client's names already start with process_ or nodejs_: keyward_process_cpu_seconds_total, not keyward_process_process_….
  collectDefaultMetrics({ register: registry, prefix: 'keyward_' });
  const countRequest = requestCounts(registry);
  const decisions = new DecisionHistogram();
  const shadowed = shadowCounts(registry);
  mirrorSources(registry, sources);
  return {
    registry,
    exposition: {
      // prom-client's default, which nothing here changes: Prometheus' text format
      get contentType() {
        return registry.contentType;
      },
      metrics: () => withDecisions(registry, decisions.counts()),
    },
    decisionCounts: () => decisions.counts(),
    request: countRequest,
    decision(outcome, seconds) {
      decisions.observe(outcome, seconds);
    },
    shadowDenials(codes) {
      for (const code of codes) shadowed.set(code, (shadowed.get(code) ?? 0) + 1);
    },
    trackInFlight(read) {
      mirror(registry, 'gauge', 'keyward_in_flight_requests', 'Requests being handled', read);
    },
    trackConfig(read) {
      configMetrics(registry, read);
    },
  };
}
