/**
 * Steady load for the scale tests: a few concurrent clients sending small chat requests in
 * a loop over a set of keys, recording each answer's status and latency with its start time.
 */
import http from 'node:http';
import { bearer, send } from './http.js';

export interface Sample {
  /** performance.now() when the request was sent */
  at: number;
  ms: number;
  status: number;
  code: string;
}

export interface Load {
  samples: Sample[];
  /** Stops the clients and resolves once every request in flight has been answered. */
  stop(): Promise<Sample[]>;
}

export function chatRequest(url: string, key: string, agent: http.Agent, body: Record<string, unknown> = {}) {
  return send(url, {
    method: 'POST', path: '/v1/chat/completions', agent,
    headers: { ...bearer(key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [], max_tokens: 16, ...body }),
  });
}

export function startLoad(opts: { urls: string[]; keys: string[]; clients: number }): Load {
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
  const samples: Sample[] = [];
  let running = true;
  let n = 0;
  const client = async (): Promise<void> => {
    while (running) {
      const i = n++;
      const at = performance.now();
      try {
        const r = await chatRequest(opts.urls[i % opts.urls.length]!, opts.keys[i % opts.keys.length]!, agent);
        samples.push({ at, ms: performance.now() - at, status: r.status, code: String(r.headers['x-keyward-error'] ?? '') });
      } catch {
        samples.push({ at, ms: performance.now() - at, status: 0, code: 'network' });
      }
    }
  };
  const clients = Array.from({ length: opts.clients }, client);
  return {
    samples,
    async stop() {
      running = false;
      await Promise.all(clients);
      agent.destroy();
      return samples;
    },
  };
}

/** Remembers when `read()` last changed (sampled every `everyMs`): "when did the last fallback admission happen". */
export function trackLastChange(read: () => number, everyMs = 10): { last(): number; stop(): void } {
  let value = read();
  let last = 0;
  const timer = setInterval(() => {
    const v = read();
    if (v !== value) {
      value = v;
      last = performance.now();
    }
  }, everyMs);
  return { last: () => last, stop: () => clearInterval(timer) };
}

export const percentile = (xs: number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? 0;
};

/**
 * Prints a test's measured figures as test diagnostics, one line each, so they appear in the
 * runner's output (TAP or spec) next to the test that measured them, in CI logs too.
 */
export function printFigures(t: { diagnostic(message: string): void }, label: string, figures: Record<string, unknown>): void {
  for (const [name, value] of Object.entries(figures)) t.diagnostic(`${label}: ${name} = ${typeof value === 'string' ? value : JSON.stringify(value)}`);
}
