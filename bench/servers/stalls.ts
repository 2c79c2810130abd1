/**
 * Optional stall recording inside a benchmark server (BENCH_STALLS=1): every GC pause
 * with its kind, wall-clock start and duration, and the event loop's delay histogram.
 * Written as one JSON line `{"stalls": ...}` on stdout at shutdown, so a slow request
 * seen by the load generator can be matched to what the server was doing then.
 */
import { monitorEventLoopDelay, PerformanceObserver, performance, constants, type PerformanceEntry } from 'node:perf_hooks';

const KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};

export function recordStalls(): (() => Record<string, unknown>) | null {
  if (process.env.BENCH_STALLS !== '1') return null;
  const gcs: { kind: string; at: number; ms: number }[] = [];
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const kind = ((e as PerformanceEntry & { detail?: { kind?: number } }).detail)?.kind ?? -1;
      gcs.push({ kind: KINDS[kind] ?? String(kind), at: performance.timeOrigin + e.startTime, ms: e.duration });
    }
  });
  obs.observe({ entryTypes: ['gc'] });
  const eld = monitorEventLoopDelay({ resolution: 1 });
  eld.enable();
  // Gaps of more than 3 ms between 1 ms ticks, with the CPU time the process used in the
  // gap: about the gap's length when the loop was busy (JS, GC), about 0 when the process
  // was off the CPU (waiting to be scheduled).
  const gaps: { at: number; ms: number; cpuMs: number }[] = [];
  let last = performance.now();
  let lastCpu = process.cpuUsage();
  const tick = setInterval(() => {
    const now = performance.now();
    const cpu = process.cpuUsage();
    if (now - last > 3) {
      const cpuMs = (cpu.user - lastCpu.user + cpu.system - lastCpu.system) / 1000;
      gaps.push({ at: performance.timeOrigin + last, ms: now - last, cpuMs });
    }
    last = now;
    lastCpu = cpu;
  }, 1);
  tick.unref();
  return () => {
    obs.disconnect();
    eld.disable();
    clearInterval(tick);
    return { gcs, gaps, eld: { p50: eld.percentile(50) / 1e6, p99: eld.percentile(99) / 1e6, max: eld.max / 1e6 } };
  };
}

/**
 * BENCH_HEAP_SAMPLE=<file>: the first SIGUSR2 starts V8's sampling heap profiler (one sample
 * per BENCH_HEAP_INTERVAL bytes allocated, 4096 unless set), the
 * second writes what of the sampled allocations is not yet collected to <file>: taken
 * under load with no major GC between, that is what outlived young-generation GCs.
 */
export async function heapSampleOnSignal(): Promise<void> {
  const file = process.env.BENCH_HEAP_SAMPLE;
  if (!file) return;
  const { Session } = await import('node:inspector/promises');
  const { writeFileSync } = await import('node:fs');
  const s = new Session();
  s.connect();
  let on = false;
  process.on('SIGUSR2', () => {
    if (!on) {
      on = true;
      void s.post('HeapProfiler.startSampling', { samplingInterval: Number(process.env.BENCH_HEAP_INTERVAL ?? 4096) });
      return;
    }
    // With --expose-gc: a young-generation GC first, so what is left outlived one.
    (globalThis as { gc?: (o: object) => void }).gc?.({ type: 'minor', execution: 'sync' });
    void s.post('HeapProfiler.stopSampling').then((r) => writeFileSync(file, JSON.stringify(r.profile)));
  });
}
