/**
 * Rate-limit headers on forwarded responses (DESIGN section 11): the key's own figures
 * under the names OpenAI clients already read, replacing whatever the upstream sent
 * (the upstream's describe the gateway's provider account, not this key). A key without
 * a limit gets no header for it.
 */
import type { Quota, QuotaFigures } from '../limits/limiter.js';

/** What the figures are added to (the forwarder's response head). */
export interface HeadLines {
  add(name: string, value: string): void;
}

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

/** Every name written here: the forwarder drops the upstream's headers of these names. */
export const QUOTA_HEADER_NAMES: readonly string[] = [...NAMES.requests, ...NAMES.tokens];

function put(head: HeadLines, names: readonly [string, string, string], figures: QuotaFigures | null): void {
  if (figures === null) return;
  const [limit, remaining, reset] = names;
  head.add(limit, String(figures.limit));
  head.add(remaining, String(Math.max(0, Math.floor(figures.remaining))));
  head.add(reset, formatReset(figures.resetMs));
}

/** Adds the key's figures to a forwarded response's head (the upstream's of these names were dropped). */
export function addQuotaHeaders(head: HeadLines, quota: Quota): void {
  put(head, NAMES.requests, quota.requests);
  put(head, NAMES.tokens, quota.tokens);
}
