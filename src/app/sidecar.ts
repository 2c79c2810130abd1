/**
 * Composition: builds the replica, limiter, sync client, usage pusher, forwarder, metrics
 * and admin listener from the config and hands them to the exchanges, which own each
 * request's life. Adapters meet only here. Shutdown drains in the order that loses nothing.
 * A reload (DESIGN section 12) puts a new snapshot of the config in force; the adapters
 * built from restart-only settings (listeners, replica, limiter, console clients) stay, the
 * limiter taking the new lease term.
 */
import { createServer, type Server } from 'node:http';
import { makeKeyHasher } from '../auth/hash.js';
import type { Config } from '../config/schema.js';
import type { Limiter } from '../limits/limiter.js';
import { createLimiter } from '../limits/create.js';
import { watchHolds } from '../limits/hold-watch.js';
import { Alerts, type AlertTuning } from '../obs/alerts/alerts.js';
import { startAdmin, type AdminServer } from '../obs/admin.js';
import type { Logger } from '../obs/logger.js';
import { createMetrics, type Metrics } from '../obs/metrics.js';
import { Traces, traceTuningFromEnv } from '../obs/tracing/sink.js';
import type { TraceTuning } from '../obs/tracing/span.js';
import type { UsageEvent } from '../protocol/usage.js';
import { ReplicaStore } from '../replica/store.js';
import type { SyncClient, UsagePusher } from '../sync/client.js';
import { consoleClients, replicaOwnership } from './console-clients.js';
import { createExchanges, type ExchangeDeps, type Exchanges } from '../proxy/exchange.js';
import { createForwarder, type Forwarder } from '../proxy/upstream/forward.js';
import { snapshotOf, Snapshots } from '../proxy/snapshot.js';
import { expectsOnlyContinue } from '../proxy/preflight.js';
import { QUOTA_HEADER_NAMES } from '../proxy/quota-headers.js';
import { SHADOW_HEADER } from '../proxy/denial.js';
import { ERROR_HEADER } from '../errors.js';
import { describeKey } from '../proxy/self.js';
import { httpUrl, listen } from './listen.js';
import type { FileIdentity } from '../replica/replica-file.js';

export interface SidecarOptions {
  config: Config;
  logger: Logger;
  /** a `--workers` worker: damage its lookups meet in the replica file, for the primary (store.ts) */
  onReplicaDamage?: (file: FileIdentity) => void;
  /** injected in tests; by default built from `config.redis` */
  limiter?: Limiter;
  /** injected in tests; by default opened at `config.replica.path` */
  replica?: ReplicaStore;
  /** receives one event per model response that reported usage; by default the console's usage push */
  usageSink?: (event: UsageEvent) => void;
  /** false in a cluster worker: the primary answers the admin port for every worker */
  admin?: boolean;
  /** trace export timings; by default the OTEL_BSP_* environment (`config.tracing` says whether there are traces) */
  traceTuning?: TraceTuning;
  /** budget alerts' check delay and retry schedule; by default the operated ones (`config.alerts` says whether there are alerts) */
  alertTuning?: AlertTuning;
}

export interface Sidecar {
  port: number;
  adminPort: number;
  url: string;
  replica: ReplicaStore;
  limiter: Limiter;
  metrics: Metrics;
  /** the tracer in force; `configure` swaps it for a new `tracing` block */
  traces: Traces;
  /** the config requests arriving now are decided under */
  config(): Config;
  /**
   * Puts `next` in force for every request that arrives from now on (DESIGN section 12);
   * requests in flight finish under the config they arrived with. Settings that need new
   * listeners or stores are not read from `next`: the caller passes their running values
   * (src/config/reload-plan.ts).
   */
  reconfigure(next: Config): Promise<void>;
  /** budget alerts; `configure` puts a new `alerts` block in force */
  alerts: Alerts;
  /** present when `console` is configured */
  sync: SyncClient | null;
  usage: UsagePusher | null;
  /** stop accepting, let in-flight requests finish within `graceMs`, release everything */
  close(opts?: { graceMs?: number }): Promise<void>;
}

/** At shutdown, how long the last spans may take to reach the collector... */
const TRACE_FLUSH_MS = 2_000;
/** ...and the last budget alerts the webhook. */
const ALERT_FLUSH_MS = 2_000;
/** How long the responses cut at the end of the grace get to close (they do within a few turns). */
const CUT_CLOSE_MS = 1_000;
/** How long a decision still waiting on Redis at shutdown gets to land (each of its calls answers within redis.timeoutMs). */
const DECISION_WAIT_MS = 5_000;

/** Warns once per distinct value (at most 100 of them): a misrouted key must not flood the log. */
function onceEach(warn: (value: string) => void): (value: string) => void {
  const seen = new Set<string>();
  return (value) => {
    if (seen.has(value) || seen.size >= 100) return;
    seen.add(value);
    warn(value);
  };
}

function limiterFor(config: Config, logger: Logger): Limiter {
  return createLimiter({
    redis: config.redis ?? null,
    leaseMs: config.limits.leaseMs,
    log: (event, fields) => logger.warn(fields, event),
  });
}

/** What the exchanges are built from: the config's settings and the adapters made above them. */
interface ExchangeParts {
  config: Config;
  logger: Logger;
  replica: ReplicaStore;
  limiter: Limiter;
  forwarder: Forwarder;
  metrics: Metrics;
  traces: Traces;
  snapshots: Snapshots;
  usageSink: ((event: UsageEvent) => void) | null;
}

function exchangeDeps(p: ExchangeParts): ExchangeDeps {
  const { config, logger, replica, limiter } = p;
  return {
    pipeline: {
      // keys.* needs a restart: the hasher is built once
      hashKey: makeKeyHasher(config.keys),
      keyFormat: config.keys.format,
      lookup: (hash) => replica.lookup(hash),
      ready: () => replica.status().ready,
      limiter,
      priceFor: (model) => replica.priceFor(model),
      onUnknownRouting: onceEach((mode) => logger.warn({ routing: mode }, 'key routing mode names no upstream; using default')),
    },
    forwarder: p.forwarder,
    metrics: p.metrics,
    access: logger.access,
    usageSink: p.usageSink,
    log: logger,
    snapshots: p.snapshots,
    describeKey: (facts) => describeKey(limiter, facts),
    traces: p.traces,
  };
}


function proxyServer(exchanges: Exchanges): Server {
  // Host lines are checked by the exchange, which answers a missing one with keyward's own body.
  const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 60_000, requireHostHeader: false });
  server.on('request', (req, res) => exchanges.handle(req, res, 'none'));
  server.on('checkContinue', (req, res) => exchanges.handle(req, res, expectsOnlyContinue(req.rawHeaders) ? 'continue' : 'unmet'));
  server.on('checkExpectation', (req, res) => exchanges.handle(req, res, 'unmet'));
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => exchanges.refuseUnparsed(err, socket));
  // Without a listener Node closes a CONNECT's connection with no answer at all.
  server.on('connect', (req, socket) => exchanges.refuseConnect(req, socket));
  return server;
}

/** Everything a running sidecar lets go of when it closes, in the order it does. */
interface Running {
  server: Server;
  exchanges: Exchanges;
  logger: Logger;
  forwarder: Forwarder;
  admin: AdminServer | null;
  usage: UsagePusher | null;
  sync: SyncClient | null;
  limiter: Limiter;
  traces: Traces;
  alerts: Alerts;
  /** stops telling the alerts of replica changes */
  stopRechecks: () => void;
  /** null when the caller handed the replica in (and closes it) */
  ownReplica: ReplicaStore | null;
}

async function shutdown(r: Running, graceMs: number): Promise<void> {
  // Node skips connections whose response is still under way.
  r.exchanges.startDraining({ closeIdle: () => r.server.closeIdleConnections() });
  r.server.close();
  r.server.closeIdleConnections();
  await r.exchanges.drained(graceMs);
  const cut = r.exchanges.cutAtShutdown();
  if (cut > 0) r.logger.warn({ in_flight: cut, grace_ms: graceMs }, 'shutdown grace over: cutting the requests still in flight');
  r.server.closeAllConnections();
  // A cut response closes a few turns later: its access line, settlement and usage event come first.
  if (cut > 0) await r.exchanges.drained(CUT_CLOSE_MS);
  r.logger.access.flush();
  r.forwarder.close();
  await r.admin?.close();
  // Every request has finished, so every span has ended: the last batch goes out.
  await r.traces.close(TRACE_FLUSH_MS);
  // A decision still waiting on Redis settles what it took before the limiter closes.
  await r.exchanges.decided(DECISION_WAIT_MS);
  // Every hold has settled: what the last requests crossed is found and gets its last attempt.
  r.stopRechecks();
  await r.alerts.close(ALERT_FLUSH_MS);
  // Last: the responses above may still have produced usage to push.
  await r.usage?.stop();
  await r.sync?.stop();
  await r.limiter.close();
  await r.ownReplica?.close();
}

/** The admin listener (none in a cluster worker: the primary answers for every worker); a failure closes the proxy server. */
async function adminFor(opts: SidecarOptions, o: { server: Server; metrics: Metrics; notReadyReason: () => string | null }): Promise<AdminServer | null> {
  if (opts.admin === false) return null;
  try {
    return await startAdmin({ host: opts.config.admin.host, port: opts.config.admin.port, exposition: o.metrics.exposition, notReadyReason: o.notReadyReason });
  } catch (err) {
    o.server.close();
    throw err;
  }
}

/**
 * Puts a config in force for the requests that arrive after it: one at a time, in the order
 * asked, so an earlier config never lands after a later one.
 */
function reconfigurer(o: { logger: Logger; snapshots: Snapshots; forwarder: Forwarder; limiter: Limiter; alerts: Alerts; traces: Traces }): (next: Config) => Promise<void> {
  let applying = Promise.resolve();
  return (next) => {
    const done = applying.then(async () => {
      o.logger.level = next.logging.level;
      o.limiter.setLeaseMs(next.limits.leaseMs);
      o.snapshots.swap(snapshotOf(next, o.forwarder.targets(next.upstreams, o.snapshots.inForce.targets)));
      o.alerts.configure(next.alerts);
      await o.traces.configure(next.tracing);
    });
    applying = done.catch(() => undefined);
    return done;
  };
}

export async function startSidecar(opts: SidecarOptions): Promise<Sidecar> {
  const { config, logger } = opts;
  const replica = opts.replica ?? new ReplicaStore({ path: config.replica.path, ...replicaOwnership(config, logger), ...(opts.onReplicaDamage ? { onDamageMet: opts.onReplicaDamage } : {}) });
  const limiter = opts.limiter ?? limiterFor(config, logger);
  const { sync, usage } = consoleClients({ config, replica, logger, pushUsage: !opts.usageSink });
  const forwarder = createForwarder({ replacedResponseHeaders: [...QUOTA_HEADER_NAMES, SHADOW_HEADER, ERROR_HEADER] });
  const traces = new Traces({ log: logger, tuning: opts.traceTuning ?? traceTuningFromEnv(process.env) });
  await traces.configure(config.tracing);
  const alerts = new Alerts({ store: limiter, log: logger, current: (id) => replica.holder(id), ...(opts.alertTuning ? { tuning: opts.alertTuning } : {}) });
  alerts.configure(config.alerts);
  const stopRechecks = replica.onChange(() => alerts.replicaChanged());
  const metrics = createMetrics({
    replica: () => replica.status(),
    limiter: () => limiter.stats(),
    ...(sync ? { sync: () => sync.status() } : {}),
    ...(usage ? { usage: () => usage.stats() } : {}),
    traces: () => traces.stats(),
    alerts: () => alerts.stats(),
  });
  const usageSink = opts.usageSink ?? (usage ? (e: UsageEvent) => usage.push(e) : null);
  const snapshots = new Snapshots(snapshotOf(config, forwarder.targets(config.upstreams, null)));
  // The pipeline's holds and settlements tell the alerts which holders to check.
  const exchanges = createExchanges(exchangeDeps({ config, logger, replica, limiter: watchHolds(limiter, alerts), forwarder, metrics, traces, snapshots, usageSink }));
  metrics.trackInFlight(() => exchanges.inFlight());

  const server = proxyServer(exchanges);
  const running: Running = { server, exchanges, logger, forwarder, admin: null, usage, sync, limiter, traces, alerts, stopRechecks, ownReplica: opts.replica ? null : replica };
  let draining = false;
  let port: number;
  try {
    port = await listen(server, config.server.port, config.server.host);
    running.admin = await adminFor(opts, { server, metrics, notReadyReason: () => (draining ? 'draining' : replica.status().ready ? null : 'replica not loaded: no sync or import yet') });
  } catch (err) {
    // A port taken: what was built lets go (the replica path's claim, Redis, timers), so a caller may try other ports.
    await shutdown(running, 0);
    throw err;
  }
  const admin = running.admin;
  // Not awaited: the replica serves what it has (a previous run's data) while the first sync runs.
  void sync?.start();

  return {
    port,
    adminPort: admin?.port ?? 0,
    sync,
    usage,
    url: httpUrl(config.server.host, port),
    replica,
    limiter,
    metrics,
    traces,
    config: () => snapshots.inForce.config,
    reconfigure: reconfigurer({ logger, snapshots, forwarder, limiter, alerts, traces }),
    alerts,
    close({ graceMs = snapshots.inForce.config.server.shutdownGraceMs } = {}) {
      draining = true;
      return shutdown(running, graceMs);
    },
  };
}
