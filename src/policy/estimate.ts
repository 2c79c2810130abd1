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
  /** a background response: its answer comes before the generation, so it never shows it */
  deferred: boolean;
  bytesSeen?: () => number;
}

/** A reported figure past any real request's (a lying or broken upstream) is held to this, and marked estimated. */
export const MAX_REPORTED_TOKENS = 10_000_000;

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
  /** `usage` gives the input alone (a stream that ended before its final counts): the output is estimated */
  inputOnly?: boolean;
  /** the request's prompt-token estimate and the output it reserved */
  promptTokens: number;
  reservedOutput: number;
  /** the upstream's status; null when no response came (unreachable, timeout, client gone first) */
  upstreamStatus: number | null;
  /** the upstream failed before any output: unreachable, timed out, or cut before its headers */
  upstreamFailed: boolean;
  /** a background response (Estimate.deferred): what it shows is not what it will generate */
  deferred: boolean;
}

/**
 * The settlement rule (DESIGN section 6), written once: the usage the response reported;
 * else prompt estimate plus ceil(generated characters / 4), at least one output token; or
 * the whole reservation where the text could not be read, or will come after the answer (a
 * background response). A reported input with no output figure keeps that input beside the
 * estimated output. Nothing is charged — null — when the upstream failed before any output
 * or answered with an error status and neither usage nor generated text, since nothing was
 * generated.
 */
export function settleUsage(r: FinishedRequest): Settled | null {
  if (r.usage && r.inputOnly) {
    const output = Math.max(r.usage.output_tokens, estimatedOutput(r));
    return { input_tokens: Math.min(r.usage.input_tokens, MAX_REPORTED_TOKENS), output_tokens: output, estimated: true };
  }
  if (r.usage) return asReported(r.usage, r.textChars);
  const generated = r.textChars !== null && r.textChars > 0;
  if (r.upstreamFailed || (r.upstreamStatus !== null && r.upstreamStatus >= 400 && !generated)) return null;
  return { input_tokens: r.promptTokens, output_tokens: estimatedOutput(r), estimated: true };
}

/** ceil(generated characters / 4), at least 1; the whole reservation where the text could not be read or comes later. */
function estimatedOutput(r: FinishedRequest): number {
  return Math.max(1, r.textChars === null || r.deferred ? r.reservedOutput : Math.ceil(r.textChars / 4));
}

/**
 * Reported usage, unless it cannot be so (then estimated): no figure past
 * MAX_REPORTED_TOKENS, and no zero output beside generated text the tap saw (section 6:
 * nothing is settled at zero output).
 */
function asReported(u: { input_tokens: number; output_tokens: number }, textChars: number | null): Settled {
  let estimated = false;
  const held = (n: number): number => (n > MAX_REPORTED_TOKENS ? ((estimated = true), MAX_REPORTED_TOKENS) : n);
  const input = held(u.input_tokens);
  let output = held(u.output_tokens);
  if (output === 0 && textChars !== null && textChars > 0) {
    output = Math.ceil(textChars / 4);
    estimated = true;
  }
  return { input_tokens: input, output_tokens: output, estimated };
}
