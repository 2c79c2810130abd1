/**
 * keyward_trace_spans_dropped_total's count (src/obs/tracing/counting.ts) held against the
 * real BatchSpanProcessor: every span the processor drops because its queue is full, and
 * every span of a batch whose export failed, is counted once, and nothing else is; at
 * shutdown, the export under way is waited for, and what is left when time is up is counted.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ROOT_CONTEXT, TraceFlags, trace } from '@opentelemetry/api';
import { ExportResultCode, type ExportResult } from '@opentelemetry/core';
import { AlwaysOnSampler, BatchSpanProcessor, ParentBasedSampler, SamplingDecision, TracerProvider, type ReadableSpan, type Sampler, type SpanExporter } from '@opentelemetry/sdk-trace';
import { countedExport } from '../../src/obs/tracing/counting.js';
import { quiet } from '../../src/log.js';
import type { SinkEvents } from '../../src/obs/tracing/span.js';

/** A collector that answers each batch when the test says so. */
class HeldExporter implements SpanExporter {
  readonly batches: { spans: ReadableSpan[]; answer: (r: ExportResult) => void }[] = [];
  private waiting: (() => void) | null = null;
  export(spans: ReadableSpan[], answer: (r: ExportResult) => void): void {
    this.batches.push({ spans, answer });
    this.waiting?.();
  }
  /** resolves once `n` batches have been handed over */
  async batch(n: number) {
    while (this.batches.length < n) await new Promise<void>((r) => (this.waiting = r));
    return this.batches[n - 1]!;
  }
  async shutdown(): Promise<void> {}
}

function setup(o: { maxQueueSize: number; maxExportBatchSize: number }, sampler: Sampler = new ParentBasedSampler({ root: new AlwaysOnSampler() })) {
  const counted = { queue_full: 0, export_failed: 0, shutdown: 0, exported: 0 };
  const events: SinkEvents = {
    log: quiet,
    dropped: (n, reason) => (counted[reason] += n),
    exported: () => counted.exported++,
  };
  const exporter = new HeldExporter();
  const processor = countedExport({
    exporter,
    events,
    capacity: o.maxQueueSize,
    batch: (e) => new BatchSpanProcessor({ exporter: e, ...o, scheduledDelayMillis: 60_000 }),
  });
  const provider = new TracerProvider({ sampler, spanProcessors: [processor] });
  const tracer = provider.getTracer('test');
  const end = (n: number) => {
    for (let i = 0; i < n; i++) tracer.startSpan(`s${i}`).end();
  };
  return { counted, exporter, processor, provider, tracer, end };
}

test('spans the full queue drops and spans of a failed export are counted; exported ones are not', async () => {
  const { counted, exporter, provider, end } = setup({ maxQueueSize: 3, maxExportBatchSize: 3 });
  end(3); // a full batch goes out at once, and its export hangs
  const first = await exporter.batch(1);
  assert.equal(first.spans.length, 3);
  end(5); // the queue takes 3 while the export hangs; the processor drops 2
  assert.equal(counted.queue_full, 2);
  first.answer({ code: ExportResultCode.FAILED, error: new Error('collector down') });
  assert.equal(counted.export_failed, 3);
  const second = await exporter.batch(2); // the 3 queued go out once the first export is over
  assert.equal(second.spans.length, 3);
  second.answer({ code: ExportResultCode.SUCCESS });
  assert.equal(counted.exported, 1);
  // Every span ended is either handed to the collector and accepted, or counted.
  const accepted = second.spans.length;
  assert.equal(accepted + counted.queue_full + counted.export_failed, 8);
  end(1);
  const flushed = provider.forceFlush();
  (await exporter.batch(3)).answer({ code: ExportResultCode.SUCCESS });
  await flushed;
  assert.deepEqual(counted, { queue_full: 2, export_failed: 3, shutdown: 0, exported: 2 });
  await provider.shutdown();
});

test('unsampled spans never join the queue and are not counted', async () => {
  const { counted, exporter, provider, tracer } = setup({ maxQueueSize: 1, maxExportBatchSize: 1 });
  const unsampled = trace.setSpanContext(ROOT_CONTEXT, { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.NONE, isRemote: true });
  for (let i = 0; i < 5; i++) tracer.startSpan('unsampled', {}, unsampled).end();
  tracer.startSpan('sampled').end();
  (await exporter.batch(1)).answer({ code: ExportResultCode.SUCCESS });
  assert.deepEqual(exporter.batches.map((b) => b.spans.map((s) => s.name)), [['sampled']]);
  assert.deepEqual(counted, { queue_full: 0, export_failed: 0, shutdown: 0, exported: 1 });
  await provider.shutdown();
});

test('spans recorded but not sampled reach the processor yet take no room in the count of its queue', async () => {
  // keyward's own samplers never record without sampling; a sampler that does must not make the count drift.
  const recordOnly: Sampler = {
    shouldSample: (_ctx, _trace, name) => ({ decision: name === 'sampled' ? SamplingDecision.RECORD_AND_SAMPLED : SamplingDecision.RECORD }),
    toString: () => 'RecordOnlyButSampled',
  };
  const { counted, exporter, provider, tracer } = setup({ maxQueueSize: 1, maxExportBatchSize: 1 }, recordOnly);
  for (let i = 0; i < 5; i++) tracer.startSpan('recorded').end();
  tracer.startSpan('sampled').end();
  (await exporter.batch(1)).answer({ code: ExportResultCode.SUCCESS });
  assert.deepEqual(exporter.batches.map((b) => b.spans.map((s) => s.name)), [['sampled']]);
  assert.deepEqual(counted, { queue_full: 0, export_failed: 0, shutdown: 0, exported: 1 });
  await provider.shutdown();
});

test('shutdown waits for the export under way; what is still under way when it gives up is counted once', async () => {
  const { counted, exporter, processor, provider, end } = setup({ maxQueueSize: 4, maxExportBatchSize: 2 });
  end(2); // a full batch goes out at once, and its export hangs
  const first = await exporter.batch(1);
  await provider.shutdown(); // the processor's shutdown does not wait for it...
  let idle = false;
  const waited = processor.idle().then(() => (idle = true));
  await Promise.resolve();
  assert.equal(idle, false, '...the sink does');
  first.answer({ code: ExportResultCode.SUCCESS });
  await waited;
  assert.deepEqual(counted, { queue_full: 0, export_failed: 0, shutdown: 0, exported: 1 });

  const next = setup({ maxQueueSize: 4, maxExportBatchSize: 2 });
  next.end(2);
  const hung = await next.exporter.batch(1);
  next.processor.abandon(); // the sink's time is up
  assert.equal(next.counted.shutdown, 2);
  hung.answer({ code: ExportResultCode.FAILED, error: new Error('too late') });
  assert.deepEqual(next.counted, { queue_full: 0, export_failed: 0, shutdown: 2, exported: 0 }, 'not counted again');
  await next.provider.shutdown().catch(() => undefined);
});
