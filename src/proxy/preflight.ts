/**
 * What is refused before the decision pipeline runs, because the request cannot be
 * forwarded as one request whatever its key: Host lines other than exactly one, or one
 * whose value is not a host (RFC 9112 section 3.2 answers each with 400; a second Host is
 * a second reading of where the request goes), a transfer coding other than plain chunked (DESIGN section 5,
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

/**
 * Whether the request's expectation is 100-continue alone: one `Expect` line whose value is
 * that. Node takes any value naming 100-continue among others (`100-continue, foo`, or two
 * lines it joins) for it; the other expectation would go unmet, and is refused (417).
 */
export function expectsOnlyContinue(raw: readonly string[]): boolean {
  let value: string | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length !== 6 || name.toLowerCase() !== 'expect') continue;
    if (value !== null) return false;
    value = raw[i + 1]!;
  }
  return value !== null && value.trim().toLowerCase() === '100-continue';
}

/** How many Host lines the request has (Node keeps only the first in `req.headers`), and the first one's value. */
function hostLines(raw: readonly string[]): { n: number; value: string } {
  let n = 0;
  let value = '';
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 4 && name.toLowerCase() === 'host' && n++ === 0) value = raw[i + 1]!;
  }
  return { n, value };
}

/**
 * `uri-host [":" port]` (RFC 9112 section 3.2, RFC 3986 section 3.2.2): a bracketed IP
 * literal (with an RFC 6874 zone id) or a reg-name. A value with `/`, `?`, `#`, `@` or a space in it would let an
 * upstream that rebuilds the URL from Host read another path than the one classified.
 * Empty is refused too: Node's client would send its own Host in its place.
 */
const HOST_VALUE = /^(?:\[[0-9A-Fa-f:.]+(?:%25[\w.~-]+)?\]|\[v[0-9A-Fa-f]+\.[\w.~!$&'()*+,;=:-]+\]|[\w.~!$&'()*+,;=%-]+)(?::\d*)?$/;

/** The refusal, or null when the request goes to the pipeline. */
export function refusedBeforeDecision(req: Preflight, rules: readonly RouteRule[]): Deny | null {
  const host = hostLines(req.rawHeaders);
  const hostOk = host.n === 1 ? HOST_VALUE.test(host.value) : host.n === 0 && req.http10;
  const codingOk = !unforwardableCoding(req.transferEncoding);
  if (hostOk && codingOk && !req.unmetExpectation) return null;
  const classified = classify(rules, req.method, req.url);
  // the pipeline's step 1 answers first
  if (!classified.ok) return null;
  const denial = !hostOk
    ? deny('invalid_request', { variant: host.n > 1 ? 'two_host' : host.n === 1 ? 'bad_host' : 'no_host' })
    : !codingOk
      ? deny('invalid_request', { variant: 'transfer_coding' })
      : deny('invalid_request', { variant: 'expectation', status: 417 });
  return denied({ route: classified.route, facts: null, upstream: null, model: null, shadow: [] }, denial);
}
