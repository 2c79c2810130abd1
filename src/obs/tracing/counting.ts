/**
 * Counting the spans that never reach the collector (keyward_trace_spans_dropped_total),
 * through the SDK's public interfaces only. A span is lost in one of two places:
 * - the BatchSpanProcessor's queue is full (its documented `maxQueueSize`: "after the size
 *   is reached spans are dropped"). The processor says nothing when it drops, so a
 *   processor in front of it keeps the same count from both ends: a sampled span ended
 *   joins the queue, a batch handed to the exporter leaves it; a span that ends while the
 *   count is at the bound is one the batch processor drops.
 * - the export failed (collector down, slow past the export timeout, or refusing): the
 *   exporter's result callback says FAILED for that batch.
 * - shutdown could not wait for it: the batch processor's shutdown does not wait for an
 *   export already under way, so the sink waits for those itself, and what is still queued
 *   or under way when its time is up is counted (`abandon`).
 * test/unit/trace-drops.test.ts holds the count against the real BatchSpanProcessor.
 */
import { TraceFlags, type Context } from '@opentelemetry/api';
import { ExportResultCode, type ExportResult } from '@opentelemetry/core';
import type { ReadableSpan, Span, SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace';
import type { SinkEvents } from './span.js';

/** An export under way; `over` once it is counted, by its result or by abandon(). */
interface Export {
  spans: number;
  over: boolean;
}

/** The exporter as the batch processor calls it: each batch leaves the queue, and a failed one is counted. */
class CountingExporter implements SpanExporter {
  private readonly underWay = new Set<Export>();
  private waiting: (() => void)[] = [];

  constructor(
    private readonly inner: SpanExporter,
    private readonly o: { taken: (spans: number) => void; events: SinkEvents },
  ) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.o.taken(spans.length);
    const e: Export = { spans: spans.length, over: false };
    this.underWay.add(e);
    this.inner.export(spans, (result) => {
      this.underWay.delete(e);
      if (!e.over) {
        e.over = true;
        if (result.code === ExportResultCode.SUCCESS) this.o.events.exported();
        else this.o.events.dropped(spans.length, 'export_failed', result.error);
      }
      if (this.underWay.size === 0) for (const wake of this.waiting.splice(0)) wake();
      done(result);
    });
  }

  /** Resolves once no export is under way. */
  idle(): Promise<void> {
    if (this.underWay.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /** The spans of the exports still under way, counted as given up: their results, if any come, are not counted again. */
  abandon(): number {
    let spans = 0;
    for (const e of this.underWay) {
      if (!e.over) spans += e.spans;
      e.over = true;
    }
    return spans;
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

/** In front of the batch processor: the queue's length seen from outside it. */
class QueueCount implements SpanProcessor {
  private queued = 0;
  private batch: SpanProcessor | null = null;
  private exporter: CountingExporter | null = null;

  constructor(private readonly o: { capacity: number; events: SinkEvents }) {}

  attach(batch: SpanProcessor, exporter: CountingExporter): void {
    this.batch = batch;
    this.exporter = exporter;
  }

  /** Resolves once no export is under way (the batch processor's shutdown does not wait for one). */
  idle(): Promise<void> {
    return this.exporter!.idle();
  }

  /** Counts what is still queued or under way as dropped: shutdown cannot wait for it any longer. */
  abandon(): void {
    const spans = this.queued + this.exporter!.abandon();
    this.queued = 0;
    if (spans > 0) this.o.events.dropped(spans, 'shutdown');
  }

  taken(spans: number): void {
    this.queued = Math.max(0, this.queued - spans);
  }

  onStart(span: Span, parent: Context): void {
    this.batch!.onStart(span, parent);
  }

  onEnd(span: ReadableSpan): void {
    // The batch processor queues sampled spans only.
    if ((span.spanContext().traceFlags & TraceFlags.SAMPLED) !== 0) {
      if (this.queued >= this.o.capacity) this.o.events.dropped(1, 'queue_full');
      else this.queued++;
    }
    this.batch!.onEnd(span);
  }

  forceFlush(): Promise<void> {
    return this.batch!.forceFlush();
  }

  shutdown(): Promise<void> {
    return this.batch!.shutdown();
  }
}

/**
 * A batch processor (built by `batch` around the exporter it is given) whose lost spans
 * are reported to `events`; `capacity` is the `maxQueueSize` it was built with.
 */
export function countedExport(o: { exporter: SpanExporter; events: SinkEvents; capacity: number; batch: (exporter: SpanExporter) => SpanProcessor }): CountedProcessor {
  const queue = new QueueCount({ capacity: o.capacity, events: o.events });
  const exporter = new CountingExporter(o.exporter, { taken: (n) => queue.taken(n), events: o.events });
  queue.attach(o.batch(exporter), exporter);
  return queue;
}

/** The span processor countedExport builds, with what shutdown needs of it. */
export type CountedProcessor = SpanProcessor & Pick<QueueCount, 'idle' | 'abandon'>;
