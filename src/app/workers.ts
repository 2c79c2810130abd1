/**
 * `keyward serve --workers N`: a node:cluster primary and N workers (src/proxy/worker.ts).
 *
 * What runs where, and why:
 * - Workers run the whole request path and share the proxy port (the cluster's
 *   round-robin hands each new connection to the next worker). Each has its own limiter
 *   connection to the one Redis, so a limit holds across workers as across instances.
 * - The primary runs what must run once per instance: the sync client, which writes the
 *   one replica file (workers see its commits through SQLite's data_version within
 *   200 ms, as they see `keyward import`); the usage pusher, fed by the workers over IPC,
 *   so each event is buffered and pushed once and one buffer bound holds per instance;
 *   and the admin port: /healthz and /readyz from its own state, /metrics as the sum of
 *   every worker's registry and its own (prom-client's aggregation: counters and
 *   histograms add up, gauges per their aggregator).
 * - SIGTERM to the primary: /readyz turns 503, every worker drains its in-flight
 *   requests within server.shutdownGraceMs and hands over its last usage events, then
 *   the primary pushes them, stops syncing and exits 0.
 * - A worker that dies unexpectedly is replaced after a pause.
 */
import cluster, { type Worker } from 'node:cluster';
import { availableParallelism } from 'node:os';
import { AggregatorRegistry, Gauge, Counter, type MetricObjectWithValues, type MetricValue } from 'prom-client';
import type { Config } from '../config/schema.js';
import { startAdmin, type AdminServer } from '../obs/admin.js';
import type { Logger } from '../obs/logger.js';
import { createMetrics } from '../obs/metrics.js';
import { ReplicaStore } from '../replica/store.js';
import { consoleClients } from './console-clients.js';
import { isMessage, type ToPrimary, type ToWorker } from './worker-messages.js';

/** A worker that does not answer a scrape within this is left out of that scrape. */
const SCRAPE_TIMEOUT_MS = 2_000;
const RESTART_DELAY_MS = 1_000;
/** Metrics the primary owns: the workers read the same replica file, so theirs would only repeat it. */
const PRIMARY_ONLY = /^keyward_replica_/;

/** `--workers` value: a positive integer, or `auto` for the number of cores. */
export function parseWorkers(value: string): number {
  if (value === 'auto') return availableParallelism();
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 1024) throw new Error(`--workers expects a positive integer or "auto", got "${value}"`);
  return n;
}

export interface WorkersOptions {
  config: Config;
  logger: Logger;
  workers: number;
}

export interface WorkerPool {
  url: string;
  port: number;
  adminPort: number;
  /** pids of the live workers */
  pids(): number[];
  /** drain every worker within `graceMs`, push the last usage, stop syncing */
  close(opts?: { graceMs?: number }): Promise<void>;
}

type MetricsJson = MetricObjectWithValues<MetricValue<string>>[];

/**
 * Sends to a worker; `onFailed` runs when the message cannot reach it. A worker can die
 * between the isConnected() check and the write, before the primary has read the end of
 * its channel: that write fails with EPIPE, and without a callback it becomes an 'error'
 * event on the Worker that nobody handles, which would end the primary and every
 * connection of the other workers with it. The exit handler deals with the dead worker.
 */
function sendTo(w: Worker, msg: ToWorker, onFailed: () => void = () => {}): void {
  if (!w.isConnected()) return onFailed();
  w.send(msg, (err) => {
    if (err) onFailed();
  });
}

export async function startWorkers(opts: WorkersOptions): Promise<WorkerPool> {
  const { config, logger } = opts;
  if (!cluster.isPrimary) throw new Error('startWorkers runs in the cluster primary');
  if (opts.workers > 1 && !config.redis) {
    // The in-process limiter counts one process's requests: N workers would each allow the whole limit.
    throw new Error(`--workers ${opts.workers} needs redis.url in the config: without Redis each worker would enforce every limit on its own`);
  }
  // Opened before any worker starts, so the schema exists before N processes open the file at once.
  const replica = new ReplicaStore({ path: config.replica.path });
  const { sync, usage } = consoleClients({ config, replica, logger, pushUsage: true });

  const live = new Map<number, Worker>();
  /** each worker's last reported replica readiness */
  const workerReady = new Map<number, boolean>();
  const listeningIds = new Set<number>();
  let restarts = 0;
  let closing = false;

  const metrics = createMetrics({
    replica: () => replica.status(),
    limiter: () => ({ redisErrors: 0, failOpenAdmissions: 0, slotsHeld: 0 }),
    ...(sync ? { sync: () => sync.status() } : {}),
    ...(usage ? { usage: () => usage.stats() } : {}),
  });
  new Gauge({ name: 'keyward_workers', help: 'Workers serving the proxy port', registers: [metrics.registry], collect() { this.set(listeningIds.size); } });
  new Counter({ name: 'keyward_worker_restarts_total', help: 'Workers replaced after an unexpected exit', registers: [metrics.registry], collect() { this.reset(); this.inc(restarts); } });

  // ---- scrapes: ask every worker, add up with the primary's own registry
  let scrapeId = 0;
  const pendingScrapes = new Map<number, (m: MetricsJson) => void>();
  const askWorker = (w: Worker): Promise<MetricsJson> => {
    const id = ++scrapeId;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        pendingScrapes.delete(id);
        resolve([]);
      }, SCRAPE_TIMEOUT_MS);
      pendingScrapes.set(id, (m) => {
        clearTimeout(timer);
        pendingScrapes.delete(id);
        resolve(m);
      });
      sendTo(w, { type: 'keyward:metrics', id }, () => pendingScrapes.get(id)?.([]));
    });
  };
  const aggregated = {
    contentType: metrics.registry.contentType,
    async metrics(): Promise<string> {
      const fromWorkers = await Promise.all([...live.values()].map(askWorker));
      const own = await metrics.registry.getMetricsAsJSON();
      const parts = [own, ...fromWorkers.map((m) => m.filter((metric) => !PRIMARY_ONLY.test(metric.name)))];
      return AggregatorRegistry.aggregate(parts).metrics();
    },
  };

  // ---- workers
  const drained = new Map<number, () => void>();
  const onMessage = (w: Worker) => (msg: unknown) => {
    if (!isMessage<ToPrimary>(msg)) return;
    if (msg.type === 'keyward:usage') {
      if (usage) for (const e of msg.events) usage.push(e);
    } else if (msg.type === 'keyward:metrics') pendingScrapes.get(msg.id)?.(msg.metrics);
    else if (msg.type === 'keyward:replica') workerReady.set(w.id, msg.ready);
    else if (msg.type === 'keyward:drained') drained.get(w.id)?.();
  };
  let startupFailed: ((err: Error) => void) | null = null;
  const fork = () => {
    const w = cluster.fork();
    live.set(w.id, w);
    w.on('message', onMessage(w));
    // Failed writes to a worker are handled where they are sent; this keeps anything else
    // that goes wrong on its channel from ending the primary.
    w.on('error', (err: Error) => logger.warn({ worker: w.id, err: err.message }, 'worker channel error'));
    w.on('listening', () => listeningIds.add(w.id));
    w.on('exit', (code, signal) => {
      live.delete(w.id);
      listeningIds.delete(w.id);
      workerReady.delete(w.id);
      drained.get(w.id)?.();
      if (closing) return;
      if (startupFailed) return startupFailed(new Error(`worker ${w.id} exited (${signal ?? `code ${code}`}) before listening`));
      restarts++;
      logger.error({ worker: w.id, code, signal }, 'worker exited unexpectedly; starting another');
      setTimeout(() => {
        if (!closing) fork();
      }, RESTART_DELAY_MS);
    });
    return w;
  };

  const admin: AdminServer = await startAdmin({
    host: config.admin.host,
    port: config.admin.port,
    registry: aggregated,
    notReadyReason: () => {
      if (closing) return 'draining';
      if (!replica.status().ready) return 'replica not loaded: no sync or import yet';
      if (listeningIds.size === 0) return 'no worker listening';
      for (const id of listeningIds) if (workerReady.get(id) !== true) return `worker ${id} has not loaded the replica yet`;
      return null;
    },
  });
  // Workers poll the file every 200 ms; after the primary's own writes they need not wait for it.
  replica.onChange(() => {
    for (const w of live.values()) sendTo(w, { type: 'keyward:replica-changed' });
  });

  let port: number;
  try {
    port = await new Promise<number>((resolve, reject) => {
      startupFailed = reject;
      let first: number | null = null;
      const started = new Set<number>();
      const onListening = (w: Worker, address: { port: number }) => {
        first ??= address.port;
        started.add(w.id);
        if (started.size >= opts.workers) {
          cluster.off('listening', onListening);
          resolve(first);
        }
      };
      cluster.on('listening', onListening);
      for (let i = 0; i < opts.workers; i++) fork();
    });
  } catch (err) {
    closing = true;
    for (const w of live.values()) w.process.kill('SIGKILL');
    await admin.close();
    replica.close();
    throw err;
  } finally {
    startupFailed = null;
  }
  // Not awaited: workers serve what the replica file holds while the first sync runs.
  void sync?.start();

  const host = config.server.host.includes(':') ? `[${config.server.host}]` : config.server.host;
  return {
    url: `http://${host}:${port}`,
    port,
    adminPort: admin.port,
    pids: () => [...live.values()].map((w) => w.process.pid!).filter(Boolean),
    async close({ graceMs = config.server.shutdownGraceMs } = {}) {
      closing = true;
      const exits = [...live.values()].map(
        (w) =>
          new Promise<void>((resolve) => {
            // A worker that overruns its grace (plus time to hand over its usage) is killed.
            const timer = setTimeout(() => w.process.kill('SIGKILL'), graceMs + 5_000);
            drained.set(w.id, () => {
              clearTimeout(timer);
              resolve();
            });
            // A worker that cannot be told is exiting already: its exit resolves this.
            sendTo(w, { type: 'keyward:drain', graceMs });
          }),
      );
      await Promise.all(exits);
      await admin.close();
      // Last: the workers' final usage events arrived before their "drained".
      await usage?.stop();
      await sync?.stop();
      replica.close();
    },
  };
}
