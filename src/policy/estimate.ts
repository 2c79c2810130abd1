/**
 * Token estimates (DESIGN section 6). Pure. What a request reserves before its usage is
 * known: prompt tokens from the body's size, plus the largest output cap it names or the
 * configured default.
 */

/** Prompt tokens from a body's size: ceil(bytes / 4). */
export function promptTokens(bodyBytes: number): number {
  return Number.isFinite(bodyBytes) && bodyBytes > 0 ? Math.ceil(bodyBytes / 4) : 0;
}

/**
 * A request's estimate: prompt tokens and the output reserved. `bytesSeen`: a body whose size
 * was not declared (a chunked multipart upload), the bytes of it read so far; only part of it
 * was read at admission, and the settlement counts the whole body.
 */
export interface Estimate {
  prompt: number;
  output: number;
  bytesSeen?: () => number;
}

/** The prompt tokens a settlement counts: the admission's, or more when the body turned out larger. */
export function settledPrompt(e: Estimate): number {
  return e.bytesSeen ? Math.max(e.prompt, promptTokens(e.bytesSeen())) : e.prompt;
}

/** TPM reservation for a request: prompt tokens estimated from the body, plus the output cap. */
export function estimateTokens(opts: { bodyBytes: number; maxOutputTokens: number | null }): number {
  const out = opts.maxOutputTokens;
  return promptTokens(opts.bodyBytes) + (typeof out === 'number' && Number.isFinite(out) && out > 0 ? Math.ceil(out) : 0);
}

/** What a finished model request is settled and billed at. */
export interface Settled {
  input_tokens: number;
  output_tokens: number;
  /** the response reported no usage: the figures are the estimate of DESIGN section 6 */
  estimated: boolean;
}

export interface FinishedRequest {
  /** the usage the response reported, if it did */
  usage: { input_tokens: number; output_tokens: number } | null;
  /** characters of generated text the tap saw; null when it could not read the response */
  textChars: number | null;
  /** the request's prompt-token estimate and the output it reserved */
  promptTokens: number;
  reservedOutput: number;
  /** the upstream's status; null when no response came (unreachable, timeout, client gone first) */
  upstreamStatus: number | null;
  /** the upstream failed before any output: unreachable, timed out, or cut before its headers */
  upstreamFailed: boolean;
}

/**
 * The settlement rule (DESIGN section 6), written once: the usage the response reported;
 * else prompt estimate plus ceil(generated characters / 4), at least one output token; or
 * the whole reservation where the text could not be read. Nothing is charged — null —
 * when the upstream failed before any output or answered with an error status and no usage,
 * since nothing was generated.
 */
export function settleUsage(r: FinishedRequest): Settled | null {
  if (r.usage) return { input_tokens: r.usage.input_tokens, output_tokens: r.usage.output_tokens, estimated: false };
  if (r.upstreamFailed || (r.upstreamStatus !== null && r.upstreamStatus >= 400)) return null;
  const output = r.textChars === null ? r.reservedOutput : Math.ceil(r.textChars / 4);
  return { input_tokens: r.promptTokens, output_tokens: Math.max(1, output), estimated: true };
}
