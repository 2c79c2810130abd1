/**
 * Token estimates (DESIGN section 6). Pure. What a request reserves before its usage is
 * known: prompt tokens from the body's size, plus the largest output cap it names or the
 * configured default.
 */

/** Prompt tokens from a body's size: ceil(bytes / 4). */
export function promptTokens(bodyBytes: number): number {
  return Number.isFinite(bodyBytes) && bodyBytes > 0 ? Math.ceil(bodyBytes / 4) : 0;
}

/** TPM reservation for a request: prompt tokens estimated from the body, plus the output cap. */
export function estimateTokens(opts: { bodyBytes: number; maxOutputTokens: number | null }): number {
  const out = opts.maxOutputTokens;
  return promptTokens(opts.bodyBytes) + (typeof out === 'number' && Number.isFinite(out) && out > 0 ? Math.ceil(out) : 0);
}
