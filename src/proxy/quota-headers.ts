/**
 * Rate-limit headers on forwarded responses (DESIGN section 11): the key's own figures
 * under the names OpenAI clients already read, replacing whatever the upstream sent
 * (the upstream's describe the gateway's provider account, not this key). A key without
 * a limit gets no header for it.
 */
import type { IncomingHttpHeaders } from 'node:http';
import type { Quota, QuotaFigures } from '../limits/limiter.js';

/** A duration as OpenAI writes it: `20ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`. */
export function formatReset(ms: number): string {
  const t = Math.max(0, Math.ceil(ms));
  if (t < 1000) return `${t}ms`;
  const h = Math.floor(t / 3_600_000);
  const m = Math.floor((t % 3_600_000) / 60_000);
  const s = (t % 60_000) / 1000;
  const sec = `${Number.isInteger(s) ? s : s.toFixed(3).replace(/0+$/, '')}s`;
  if (h > 0) return `${h}h${m}m${sec}`;
  if (m > 0) return `${m}m${sec}`;
  return sec;
}

const NAMES = {
  requests: ['x-ratelimit-limit-requests', 'x-ratelimit-remaining-requests', 'x-ratelimit-reset-requests'],
  tokens: ['x-ratelimit-limit-tokens', 'x-ratelimit-remaining-tokens', 'x-ratelimit-reset-tokens'],
} as const;

function put(headers: IncomingHttpHeaders, names: readonly [string, string, string], figures: QuotaFigures | null): void {
  const [limit, remaining, reset] = names;
  if (figures === null) {
    for (const n of names) if (headers[n] !== undefined) delete headers[n];
    return;
  }
  headers[limit] = String(figures.limit);
  headers[remaining] = String(Math.max(0, Math.floor(figures.remaining)));
  headers[reset] = formatReset(figures.resetMs);
}

/** Writes the key's figures into a response's headers before they go to the client. */
export function applyQuotaHeaders(headers: IncomingHttpHeaders, quota: Quota): void {
  put(headers, NAMES.requests, quota.requests);
  put(headers, NAMES.tokens, quota.tokens);
}
