/**
 * /metrics of a `serve --workers N` primary: every worker's registry, asked for over IPC,
 * added up with the primary's own (prom-client's aggregation: counters and histograms add
 * up, gauges per their aggregator), and the workers' decision histograms added up after it.
 * A worker that exits leaves its counters and histograms, as last scraped, in a retired
 * total: Prometheus reads a total that falls as a counter reset, and would count the
 * surviving workers' requests again.
 */
import type { Worker } from 'node:cluster';
import { AggregatorRegistry, type MetricObjectWithValues, type MetricValue, type Registry } from 'prom-client';
import { addCounts, type DecisionCounts } from '../obs/decision-histogram.js';
import { withDecisions, type Exposition } from '../obs/metrics.js';
import { sendTo } from './worker-messages.js';

/** A worker that does not answer a scrape within this counts as its last scrape's counters and histograms. */
const SCRAPE_TIMEOUT_MS = 2_000;
/**
 * Metrics the primary owns: the workers read the same replica file, so theirs would only
 * repeat it, and only the primary reads the config file.
 */
const PRIMARY_ONLY = /^keyward_(replica|config)_/;

type MetricsJson = MetricObjectWithValues<MetricValue<string>>[];

/**
 * A limit of each process, which prom-client's aggregation would add up (its default for a
 * gauge): the lowest is what holds for each process. Event-loop lag keeps prom-client's own
 * rules (mean, with the min and max series beside it).
 */
const LIMITS = new Set(['keyward_process_max_fds']);
const aggregatedAsLimits = (metrics: MetricsJson): MetricsJson =>
  metrics.map((m) => (LIMITS.has(m.name) ? { ...m, aggregator: 'min' } : m));

/** One worker's answer to a scrape. */
interface Scrape {
  metrics: MetricsJson;
  decisions: DecisionCounts;
}

const NOTHING: Scrape = { metrics: [], decisions: [] };
/** Retired workers' scrapes kept apart before they are added up into one. */
const RETIRED_KEPT = 8;

/**
 * What of a worker's last scrape outlives it: what adds up over time, not its gauges.
 * (prom-client's typings declare `type` a numeric enum; its JSON carries the type's name.)
 */
const lasting = (metrics: MetricsJson): MetricsJson =>
  metrics.filter((m) => {
    const kind: unknown = m.type;
    return kind === 'counter' || kind === 'histogram';
  });

/** What the admin listener serves on a primary. */
export class WorkerScrapes implements Exposition {
  private lastId = 0;
  /** scrapes asked of a worker and not answered yet, by id */
  private readonly pending = new Map<number, (s: Scrape) => void>();
  /** each live worker's last answer, by worker id */
  private readonly last = new Map<number, Scrape>();
  /** what the workers that exited had counted, at their last scrape (one entry each) */
  private readonly retired: Scrape[] = [];

  constructor(private readonly o: { own: Registry; workers: () => Iterable<Worker> }) {}

  get contentType(): Registry['contentType'] {
    return this.o.own.contentType;
  }

  async metrics(): Promise<string> {
    if (this.retired.length > RETIRED_KEPT) await this.compact();
    // taken before the workers answer: a worker that answers and then exits is in this scrape once, live
    const retired = [...this.retired];
    const fromWorkers = [...(await Promise.all([...this.o.workers()].map((w) => this.ask(w)))), ...retired];
    const own = await this.o.own.getMetricsAsJSON();
    const parts = [own, ...fromWorkers.map((s) => s.metrics.filter((metric) => !PRIMARY_ONLY.test(metric.name)))].map(aggregatedAsLimits);
    // The primary forwards nothing, so the decisions are the workers' alone.
    return withDecisions(AggregatorRegistry.aggregate(parts), addCounts(fromWorkers.map((s) => s.decisions)));
  }

  /** Worker `id` exited: what it had counted at its last scrape stays in the totals (a worker replaced now and then: a short list). */
  retire(id: number): void {
    const last = this.last.get(id);
    this.last.delete(id);
    if (last) this.retired.push({ metrics: lasting(last.metrics), decisions: last.decisions });
  }

  /** Adds the retired entries up into one, so a worker that keeps failing does not grow the list. */
  private async compact(): Promise<void> {
    const n = this.retired.length;
    const some = this.retired.slice(0, n);
    const metrics = (await AggregatorRegistry.aggregate(some.map((s) => s.metrics)).getMetricsAsJSON()) as MetricsJson;
    // entries retired meanwhile stay behind the sum
    this.retired.splice(0, n, { metrics, decisions: addCounts(some.map((s) => s.decisions)) });
  }

  /** What worker `id` counted at its end, sent as it drained: its totals stay whole when it exits. */
  final(id: number, scrape: Scrape): void {
    if (scrape.metrics.length > 0) this.last.set(id, scrape);
  }

  /** A worker's answer to scrape `id`. */
  answered(id: number, scrape: Scrape): void {
    this.pending.get(id)?.(scrape);
  }

  /**
   * One worker's metrics (kept as its last). A worker that cannot be asked, does not answer
   * in time (a long pause, a busy IPC channel) or could not read its registry counts as what
   * adds up of its last answer: its totals would fall for one scrape and come back at the
   * next, two counter resets to Prometheus.
   */
  private async ask(w: Worker): Promise<Scrape> {
    const scrape = await this.askOnce(w);
    if (scrape.metrics.length > 0) {
      this.last.set(w.id, scrape);
      return scrape;
    }
    const last = this.last.get(w.id);
    return last ? { metrics: lasting(last.metrics), decisions: last.decisions } : NOTHING;
  }

  private askOnce(w: Worker): Promise<Scrape> {
    const id = ++this.lastId;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        resolve(NOTHING);
      }, SCRAPE_TIMEOUT_MS);
      this.pending.set(id, (m) => {
        clearTimeout(timer);
        this.pending.delete(id);
        resolve(m);
      });
      sendTo(w, { type: 'keyward:metrics', id }, () => this.pending.get(id)?.(NOTHING));
    });
  }
}
