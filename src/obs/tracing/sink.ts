/**
 * Traces (DESIGN section 13) as the exchange sees them: a sink that starts one span per
 * request and ends it with what the request came to. `Traces` holds the sink in force and
 * can swap it for one built from a new `tracing` block (a reload, DESIGN section 12): a
 * span ends on the sink it started on, and a replaced sink closes only once its last
 * span has ended, so nothing in flight is lost. This module imports nothing of
 * OpenTelemetry: the SDK is loaded (otel.ts) only when `tracing` is configured.
 */
import type { IncomingHttpHeaders } from 'node:http';
import type { LogSink } from '../../log.js';
import type { RequestSpan, SinkEvents, SinkFactory, SpanSource, TraceSink, TraceTuning, TracingConfig } from './span.js';

/**
 * The batch settings the OpenTelemetry specification names for every SDK's environment
 * (`OTEL_BSP_*`), which the JavaScript BatchSpanProcessor does not read itself. A value
 * that is not a positive integer is ignored. The exporter reads its own
 * (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `_HEADERS`, `_COMPRESSION`).
 */
export function traceTuningFromEnv(env: Record<string, string | undefined>): TraceTuning {
  const positive = (name: string): number | undefined => {
    const n = Number(env[name]?.trim() || NaN);
    return Number.isInteger(n) && n > 0 ? n : undefined;
  };
  const tuning: TraceTuning = {};
  const delay = positive('OTEL_BSP_SCHEDULE_DELAY');
  const queue = positive('OTEL_BSP_MAX_QUEUE_SIZE');
  const batch = positive('OTEL_BSP_MAX_EXPORT_BATCH_SIZE');
  if (delay !== undefined) tuning.scheduledDelayMs = delay;
  if (queue !== undefined) tuning.maxQueueSize = queue;
  if (batch !== undefined) tuning.maxExportBatchSize = batch;
  return tuning;
}

const sameConfig = (a: TracingConfig | undefined, b: TracingConfig | undefined): boolean =>
  a === b || (a !== undefined && b !== undefined && a.otlpUrl === b.otlpUrl && a.sampleRatio === b.sampleRatio && a.propagate === b.propagate);

/** Loads the OpenTelemetry SDK on first use: a sidecar without `tracing` never imports it. */
const loadOtel: () => Promise<SinkFactory> = async () => (await import('./otel.js')).createOtelSink;

export interface TracesOptions {
  log: LogSink;
  tuning?: TraceTuning;
  /** builds a sink from a `tracing` block; by default the OpenTelemetry SDK, imported on first use */
  load?: () => Promise<SinkFactory>;
}

/** The sink in force, the running count of dropped spans, and the swap a reload makes. */
export class Traces implements SpanSource {
  private sink: TraceSink | null = null;
  /** the `tracing` block the sink was built from */
  private config: TracingConfig | undefined = undefined;
  /** counts configure calls: the last one wins when two overlap */
  private generation = 0;
  private droppedSpans = 0;
  /** export failing since the last success: logged once per outage, not per batch */
  private failing = false;
  private readonly events: SinkEvents;
  /**
   * Sinks a reload replaced, still closing (waiting for their last spans, or exporting them):
   * shutdown waits for them as for the sink in force, or counts what they did not send.
   */
  private readonly retiring = new Map<TraceSink, Promise<void>>();

  constructor(private readonly o: TracesOptions) {
    this.events = {
      log: o.log,
      dropped: (spans, reason, err) => {
        this.droppedSpans += spans;
        if (reason === 'export_failed' && !this.failing) {
          this.failing = true;
          o.log.warn({ spans, err: err?.message ?? null }, 'trace export failed; spans are dropped until the collector answers');
        }
        if (reason === 'shutdown') o.log.warn({ spans }, 'trace export not done when the shutdown deadline came; spans are dropped');
      },
      exported: () => {
        // the next failure is worth a log line again
        this.failing = false;
      },
    };
  }

  /** null when tracing is off: the exchange then does nothing more for traces */
  start(headers: IncomingHttpHeaders): RequestSpan | null {
    return this.sink === null ? null : this.sink.start(headers);
  }

  /**
   * Puts a sink for `config` in force (none when undefined); the same settings keep the
   * sink in force. The one it replaces keeps the spans already started on it and closes in
   * the background once they have ended.
   */
  async configure(config: TracingConfig | undefined): Promise<void> {
    const generation = ++this.generation;
    if (sameConfig(config, this.config)) return;
    const factory = config ? await (this.o.load ?? loadOtel)() : null;
    // A later configure call got here first (or is still loading): it decides.
    if (generation !== this.generation) return;
    const previous = this.sink;
    this.sink = factory && config ? factory({ config, tuning: this.o.tuning ?? {}, events: this.events }) : null;
    this.config = config;
    if (previous) this.retire(previous);
  }

  private retire(sink: TraceSink): void {
    const closing = sink.close().catch((err: Error) => this.o.log.warn({ err: err.message }, 'closing the previous tracer failed'));
    this.retiring.set(sink, closing);
    void closing.finally(() => this.retiring.delete(sink));
  }

  stats(): { dropped: number } {
    return { dropped: this.droppedSpans };
  }

  /** Sends what is left within `timeoutMs`; a collector that does not answer by then gets nothing more, and what it did not get is counted as dropped. */
  async close(timeoutMs: number): Promise<void> {
    const sink = this.sink;
    this.sink = null;
    this.config = undefined;
    this.generation++;
    const closing = new Map(this.retiring);
    if (sink) closing.set(sink, sink.close().catch((err: Error) => this.o.log.warn({ err: err.message }, 'closing the tracer failed')));
    if (closing.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const gaveUp = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), timeoutMs).unref()));
    const closed = Promise.all(closing.values()).then(() => 'closed' as const);
    // Every sink that has not finished by then: what it still holds is counted as dropped.
    if ((await Promise.race([closed, gaveUp])) === 'late') for (const s of closing.keys()) s.abandon();
    clearTimeout(timer);
  }
}
