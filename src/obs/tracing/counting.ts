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
 * test/unit/trace-drops.test.ts holds the count against the real BatchSpanProcessor.
 */
import { TraceFlags, type Context } from '@opentelemetry/api';
import { ExportResultCode, type ExportResult } from '@opentelemetry/core';
import type { ReadableSpan, Span, SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace';
import type { SinkEvents } from './span.js';

/** The exporter as the batch processor calls it: each batch leaves the queue, and a failed one is counted. */
class CountingExporter implements SpanExporter {
  constructor(
    private readonly inner: SpanExporter,
    private readonly o: { taken: (spans: number) => void; events: SinkEvents },
  ) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.o.taken(spans.length);
    this.inner.export(spans, (result) => {
      if (result.code === ExportResultCode.SUCCESS) this.o.events.exported();
      else this.o.events.dropped(spans.length, 'export_failed', result.error);
      done(result);
    });
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

  constructor(private readonly o: { capacity: number; events: SinkEvents }) {}

  attach(batch: SpanProcessor): void {
    this.batch = batch;
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
export function countedExport(o: { exporter: SpanExporter; events: SinkEvents; capacity: number; batch: (exporter: SpanExporter) => SpanProcessor }): SpanProcessor {
  const queue = new QueueCount({ capacity: o.capacity, events: o.events });
  queue.attach(o.batch(new CountingExporter(o.exporter, { taken: (n) => queue.taken(n), events: o.events })));
  return queue;
}
