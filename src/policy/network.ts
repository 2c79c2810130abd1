/**
 * A key's network policy (DESIGN section 4, step 3b). Pure: addresses and CIDRs are
 * parsed here, by hand, into 16-byte forms (IPv4 as IPv4-mapped IPv6), so one compare
 * serves both families and `::ffff:10.0.0.1` is the same client as `10.0.0.1`.
 */
import { deny, type Denial } from '../errors.js';

export interface Cidr {
  bytes: Uint8Array;
  /** prefix length over the 16-byte form (an IPv4 /8 is 96 + 8) */
  bits: number;
}

const V4_MAPPED = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

function parseV4(s: string): number[] | null {
  const parts = s.split('.');
  if (parts.length !== 4) return null;
  const out: number[] = [];
  for (const p of parts) {
    if (!/^\d{1,3}$/.test(p) || (p.length > 1 && p.startsWith('0'))) return null;
    const n = Number(p);
    if (n > 255) return null;
    out.push(n);
  }
  return out;
}

function parseV6(s: string): number[] | null {
  if (s.length > 45) return null;
  let tail: number[] = [];
  let text = s;
  const lastColon = s.lastIndexOf(':');
  if (s.includes('.')) {
    // an embedded IPv4 tail (::ffff:1.2.3.4)
    const v4 = parseV4(s.slice(lastColon + 1));
    if (!v4) return null;
    tail = v4;
    text = `${s.slice(0, lastColon + 1)}0:0`;
  }
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const groups = (h: string) => (h === '' ? [] : h.split(':'));
  const head = groups(halves[0]!);
  const rest = halves.length === 2 ? groups(halves[1]!) : [];
  const total = head.length + rest.length;
  if (halves.length === 1 ? total !== 8 : total > 7) return null;
  const all = [...head, ...Array<string>(8 - total).fill('0'), ...rest];
  const bytes: number[] = [];
  for (const g of all) {
    if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return null;
    const n = parseInt(g, 16);
    bytes.push(n >> 8, n & 0xff);
  }
  if (tail.length) bytes.splice(12, 4, ...tail);
  return bytes;
}

/** An address as 16 bytes, or null when it is not an IPv4 or IPv6 address. */
export function parseIp(s: string): Uint8Array | null {
  const text = s.trim();
  const v4 = parseV4(text);
  if (v4) return Uint8Array.from([...V4_MAPPED, ...v4]);
  const v6 = parseV6(text.startsWith('[') && text.endsWith(']') ? text.slice(1, -1) : text);
  return v6 ? Uint8Array.from(v6) : null;
}

/** `10.0.0.0/8`, `2001:db8::/32`, or a bare address (a /32 or /128). */
export function parseCidr(s: string): Cidr | null {
  const slash = s.indexOf('/');
  const addr = slash === -1 ? s : s.slice(0, slash);
  const bytes = parseIp(addr);
  if (!bytes) return null;
  const v4 = parseV4(addr.trim()) !== null;
  const max = v4 ? 32 : 128;
  let len = max;
  if (slash !== -1) {
    const p = s.slice(slash + 1);
    if (!/^\d{1,3}$/.test(p) || Number(p) > max) return null;
    len = Number(p);
  }
  return { bytes, bits: v4 ? 96 + len : len };
}

export function inCidr(ip: Uint8Array, cidr: Cidr): boolean {
  const full = cidr.bits >> 3;
  for (let i = 0; i < full; i++) if (ip[i] !== cidr.bytes[i]) return false;
  const rem = cidr.bits & 7;
  if (rem === 0) return true;
  const mask = (0xff << (8 - rem)) & 0xff;
  return (ip[full]! & mask) === (cidr.bytes[full]! & mask);
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
  if (opts.trusted.length === 0 || !inAny(peer, opts.trusted)) return opts.peer!;
  const hops = opts.forwardedFor.flatMap((line) => line.split(',')).map((h) => h.trim());
  for (let i = hops.length - 1; i >= 0; i--) {
    const ip = parseIp(hops[i]!);
    if (!ip) return null; // a garbled hop: the chain cannot be trusted past it
    if (!inAny(ip, opts.trusted)) return hops[i]!;
  }
  // every hop is a trusted proxy: the left-most is the closest we know to the client
  return hops[0] ?? opts.peer!;
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
    parsed = list.map(parseCidr).filter((c): c is Cidr => c !== null);
    if (cidrCache.size > 10_000) cidrCache.clear();
    cidrCache.set(k, parsed);
  }
  return parsed;
}

/** Step 3b: the key's `ips`, then the browser rule. */
export function checkNetwork(key: NetworkFacts, request: { clientIp: string | null; browser: boolean; refuseBrowsers: boolean }): Denial | null {
  if (key.ips !== null && key.ips.length > 0) {
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
