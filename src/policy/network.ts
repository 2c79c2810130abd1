/**
 * A key's network policy (DESIGN section 4, step 3b). Pure. Ranges and addresses are
 * parsed by the protocol's CIDR reader (one parser for what the console sends and what
 * the socket reports); an IPv4-mapped IPv6 peer (`::ffff:10.0.0.1`, what a dual-stack
 * listener reports) is the IPv4 client it stands for.
 */
import { deny, type Denial } from '../errors.js';
import { cidrContains, parseCidr, parseIPv4, parseIPv6, type Cidr } from '../protocol/cidr.js';

export type { Cidr };

const MAPPED_PREFIX = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/** An address as 4 (IPv4) or 16 (IPv6) bytes, or null when it is neither. */
export function parseIp(text: string): Uint8Array | null {
  const t = text.trim();
  if (!t.includes(':')) return parseIPv4(t);
  const v6 = parseIPv6(t.startsWith('[') && t.endsWith(']') ? t.slice(1, -1) : t);
  if (v6 && MAPPED_PREFIX.every((b, i) => v6[i] === b)) return v6.subarray(12);
  return v6;
}

/**
 * A range from config: CIDR notation, or a bare address for exactly that address. An
 * IPv4-mapped range (`::ffff:10.0.0.0/104`) is the IPv4 range it stands for, since a
 * mapped peer is read as its IPv4 address: the mapped form an access line once showed
 * must match when copied into `ips`.
 */
export function parseRange(text: string): Cidr | null {
  const t = text.trim();
  const range = parseCidr(t.includes('/') ? t : `${t}/${t.includes(':') ? 128 : 32}`);
  if (range && range.bytes.length === 16 && range.prefix >= 96 && MAPPED_PREFIX.every((b, i) => range.bytes[i] === b)) {
    return { bytes: range.bytes.subarray(12), prefix: range.prefix - 96 };
  }
  return range;
}

/** The address as the policy reads it: an IPv4-mapped IPv6 address in its IPv4 form. */
function plainAddress(text: string): string {
  // A first character test before any string is made: most peers are plain IPv4 or IPv6.
  return text.charCodeAt(0) === 0x3a && text.length > 7 && text.slice(0, 7).toLowerCase() === '::ffff:' && text.includes('.') ? text.slice(7) : text;
}

export function inCidr(ip: Uint8Array, range: Cidr): boolean {
  return cidrContains(range, ip);
}

const inAny = (ip: Uint8Array, list: readonly Cidr[]) => list.some((c) => inCidr(ip, c));

/**
 * The client's address: the socket's peer, or — only when the peer is a trusted proxy —
 * the right-most X-Forwarded-For entry that is not itself trusted (entries to its left
 * were written by the client and prove nothing). Every X-Forwarded-For line counts, in
 * order. Null when the address that decides cannot be read.
 */
export function clientAddress(opts: { peer: string | undefined; forwardedFor: readonly string[]; trusted: readonly Cidr[] }): string | null {
  const peer = opts.peer === undefined ? null : parseIp(opts.peer);
  if (!peer) return null;
  if (opts.trusted.length === 0 || !inAny(peer, opts.trusted)) return plainAddress(opts.peer!);
  const hops = opts.forwardedFor.flatMap((line) => line.split(',')).map((h) => h.trim());
  for (let i = hops.length - 1; i >= 0; i--) {
    const ip = parseIp(hops[i]!);
    if (!ip) return null; // a garbled hop: the chain cannot be trusted past it
    if (!inAny(ip, opts.trusted)) return plainAddress(hops[i]!);
  }
  // every hop is a trusted proxy: the left-most is the closest we know to the client
  return plainAddress(hops[0] ?? opts.peer!);
}

export interface NetworkFacts {
  ips: readonly string[] | null;
  allowBrowser: boolean;
}

/** Parsed CIDR lists, cached by the list's text: keys repeat, parsing per request would not. */
const cidrCache = new Map<string, Cidr[]>();

function cidrs(list: readonly string[]): Cidr[] {
  const k = list.join(',');
  let parsed = cidrCache.get(k);
  if (!parsed) {
    // An entry that does not parse matches nothing: a bad list fails closed.
    parsed = list.map(parseRange).filter((c): c is Cidr => c !== null);
    if (cidrCache.size > 10_000) cidrCache.clear();
    cidrCache.set(k, parsed);
  }
  return parsed;
}

/**
 * Step 3b: the key's `ips`, then the browser rule. An empty `ips` list is set (null is not):
 * no address falls in it, so it refuses every client, as a list whose last range was
 * removed should; the console's admin API never sends one, another console may.
 */
export function checkNetwork(key: NetworkFacts, request: { clientIp: string | null; browser: boolean; refuseBrowsers: boolean }): Denial | null {
  if (key.ips !== null) {
    const ip = request.clientIp === null ? null : parseIp(request.clientIp);
    if (!ip || !inAny(ip, cidrs(key.ips))) return deny('ip_not_allowed');
  }
  if (request.browser && request.refuseBrowsers && !key.allowBrowser) return deny('browser_request_refused');
  return null;
}

/**
 * Whether a request comes from a browser (DESIGN section 4): it carries Origin, or
 * Sec-Fetch-Mode. One exception, or no server-side client could call keyward: Node's
 * (and Deno's, Bun's) built-in fetch, which the official SDKs use, sends a bare
 * `sec-fetch-mode: cors` on every request. A browser never sends Sec-Fetch-Mode alone —
 * Sec-Fetch-Site and Sec-Fetch-Dest always come with it — so only that exact bare
 * header is read as a server.
 */
export function looksLikeBrowser(rawHeaders: readonly string[]): boolean {
  let mode: string | null = null;
  let siteOrDest = false;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!;
    if (name.length === 6 && name.toLowerCase() === 'origin') return true;
    if (name.length < 14 || !/^sec-fetch-/i.test(name)) continue;
    const lower = name.toLowerCase();
    if (lower === 'sec-fetch-mode') mode = rawHeaders[i + 1]!.trim().toLowerCase();
    else if (lower === 'sec-fetch-site' || lower === 'sec-fetch-dest') siteOrDest = true;
  }
  return mode !== null && (mode !== 'cors' || siteOrDest);
}
