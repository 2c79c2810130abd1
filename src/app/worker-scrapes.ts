/**
 * /metrics of a `serve --workers N` primary: every worker's registry, asked for over IPC,
 * added up with the primary's own (prom-client's aggregation: counters and histograms add
 * up, gauges per their aggregator).
 */
import type { Worker } from 'node:cluster';
import { AggregatorRegistry, type MetricObjectWithValues, type MetricValue, type Registry } from 'prom-client';
import { sendTo } from './worker-messages.js';

/** A worker that does not answer a scrape within this is left out of that scrape. */
const SCRAPE_TIMEOUT_MS = 2_000;
/**
 * Metrics the primary owns: the workers read the same replica file, so theirs would only
 * repeat it, and only the primary reads the config file.
 */
const PRIMARY_ONLY = /^keyward_(replica|config)_/;

type MetricsJson = MetricObjectWithValues<MetricValue<string>>[];

/** Renders like a registry, for the admin listener. */
export class WorkerScrapes {
  private lastId = 0;
  /** scrapes asked of a worker and not answered yet, by id */
  private readonly pending = new Map<number, (m: MetricsJson) => void>();

  constructor(private readonly o: { own: Registry; workers: () => Iterable<Worker> }) {}

  get contentType(): Registry['contentType'] {
    return this.o.own.contentType;
  }

  async metrics(): Promise<string> {
    const fromWorkers = await Promise.all([...this.o.workers()].map((w) => this.ask(w)));
    const own = await this.o.own.getMetricsAsJSON();
    const parts = [own, ...fromWorkers.map((m) => m.filter((metric) => !PRIMARY_ONLY.test(metric.name)))];
    return AggregatorRegistry.aggregate(parts).metrics();
  }

  /** A worker's answer to scrape `id`. */
  answered(id: number, metrics: MetricsJson): void {
    this.pending.get(id)?.(metrics);
  }

  /** One worker's metrics; none when it cannot be asked or does not answer in time. */
  private ask(w: Worker): Promise<MetricsJson> {
    const id = ++this.lastId;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        resolve([]);
      }, SCRAPE_TIMEOUT_MS);
      this.pending.set(id, (m) => {
        clearTimeout(timer);
        this.pending.delete(id);
        resolve(m);
      });
      sendTo(w, { type: 'keyward:metrics', id }, () => this.pending.get(id)?.([]));
    });
  }
}
