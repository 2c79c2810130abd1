/**
 * What is refused before the decision pipeline runs, because the request cannot be
 * forwarded as one request whatever its key: Host lines other than exactly one (RFC 9112
 * section 3.2 answers both with 400; a second Host is a second reading of where the
 * request goes), a transfer coding other than plain chunked (DESIGN section 5,
 * "Framing": such a body is never forwarded, so it must not take from any limit first),
 * and an `Expect` other than 100-continue (417). The path is classified
 * first all the same (DESIGN section 3: before anything else), so an unknown or unclean
 * path is still the pipeline's 404 or 400 `invalid_path`.
 */
import { deny } from '../errors.js';
import { classify, type RouteRule } from '../routes.js';
import { denied, type Deny } from './pipeline.js';
import { unforwardableCoding } from './upstream/framing.js';

export interface Preflight {
  method: string;
  url: string;
  rawHeaders: readonly string[];
  /** HTTP/1.0: a request without Host is allowed */
  http10: boolean;
  /** the request's `Expect` asks for something other than 100-continue */
  unmetExpectation: boolean;
  /** the request's Transfer-Encoding value, as Node's header object has it */
  transferEncoding: string | undefined;
}

/** How many Host lines the request has (Node keeps only the first in `req.headers`). */
function hostLines(raw: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 4 && name.toLowerCase() === 'host') n++;
  }
  return n;
}

/** The refusal, or null when the request goes to the pipeline. */
export function refusedBeforeDecision(req: Preflight, rules: readonly RouteRule[]): Deny | null {
  const hosts = hostLines(req.rawHeaders);
  const hostOk = hosts === 1 || (hosts === 0 && req.http10);
  const codingOk = !unforwardableCoding(req.transferEncoding);
  if (hostOk && codingOk && !req.unmetExpectation) return null;
  const classified = classify(rules, req.method, req.url);
  // the pipeline's step 1 answers first
  if (!classified.ok) return null;
  const denial = !hostOk
    ? deny('invalid_request', { variant: hosts > 1 ? 'two_host' : 'no_host' })
    : !codingOk
      ? deny('invalid_request', { variant: 'transfer_coding' })
      : deny('invalid_request', { variant: 'expectation', status: 417 });
  return denied({ route: classified.route, facts: null, upstream: null, model: null, shadow: [] }, denial);
}
