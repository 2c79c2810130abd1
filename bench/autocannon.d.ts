/** The part of autocannon@8's programmatic API the benchmark uses (it ships no types). */
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events';

  namespace autocannon {
    interface Options {
      url: string;
      method?: string;
      headers?: Record<string, string>;
      body?: string | Buffer;
      connections?: number;
      pipelining?: number;
      /** seconds */
      duration?: number;
      /** requests in all, instead of a duration */
      amount?: number;
      overallRate?: number;
      connectionRate?: number;
      timeout?: number;
    }
    interface Histogram {
      average: number;
      mean: number;
      stddev: number;
      min: number;
      max: number;
      total: number;
      p50: number;
      p99: number;
    }
    interface Result {
      '2xx': number;
      non2xx: number;
      errors: number;
      timeouts: number;
      /** seconds */
      duration: number;
      requests: Histogram;
      latency: Histogram;
      throughput: Histogram;
    }
    /** An EventEmitter ('response', 'done', …) that is also a promise of the result. */
    interface Instance extends EventEmitter, PromiseLike<Result> {}
  }

  function autocannon(opts: autocannon.Options): autocannon.Instance;
  export = autocannon;
}
