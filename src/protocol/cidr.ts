/**
 * CIDR notation for key network policy (DESIGN section 4, `ips` on key records). Pure:
 * parses IPv4 (`10.0.0.0/8`) and IPv6 (`2001:db8::/32`, `::ffff:10.0.0.0/104`) ranges into
 * bytes and a prefix length, so a range is validated once, where it is read, and matched
 * without string work. Written out rather than taken from node:net to keep the protocol
 * free of I/O modules, and strict where parsers differ: no leading zeros in IPv4 octets
 * (some read them as octal), no zone ids, a prefix length is required.
 */

export interface Cidr {
  /** 4 bytes (IPv4) or 16 bytes (IPv6) */
  bytes: Uint8Array;
  prefix: number;
}

export function parseIPv4(text: string): Uint8Array | null {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  const out = new Uint8Array(4);
  for (let i = 0; i < 4; i++) {
    const p = parts[i]!;
    if (!/^(0|[1-9][0-9]{0,2})$/.test(p)) return null;
    const n = Number(p);
    if (n > 255) return null;
    out[i] = n;
  }
  return out;
}

function parseGroups(text: string): number[] | null {
  if (text === '') return [];
  const out: number[] = [];
  for (const g of text.split(':')) {
    if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return null;
    out.push(parseInt(g, 16));
  }
  return out;
}

export function parseIPv6(text: string): Uint8Array | null {
  let head = text;
  let tail: number[] = [];
  // An embedded IPv4 address may end the text (`::ffff:1.2.3.4`): it stands for two groups.
  const lastColon = text.lastIndexOf(':');
  if (lastColon !== -1 && text.includes('.', lastColon)) {
    const v4 = parseIPv4(text.slice(lastColon + 1));
    if (!v4) return null;
    tail = [(v4[0]! << 8) | v4[1]!, (v4[2]! << 8) | v4[3]!];
    head = text.slice(0, lastColon + 1);
    // `::1.2.3.4` leaves `::`; `a::b:1.2.3.4` leaves `a::b:` whose colon belonged to the v4 part
    if (head.endsWith(':') && !head.endsWith('::')) head = head.slice(0, -1);
  }
  const halves = head.split('::');
  if (halves.length > 2) return null;
  let groups: number[];
  if (halves.length === 2) {
    const left = parseGroups(halves[0]!);
    const right = parseGroups(halves[1]!);
    if (!left || !right) return null;
    const missing = 8 - left.length - right.length - tail.length;
    if (missing < 1) return null;
    groups = [...left, ...new Array<number>(missing).fill(0), ...right, ...tail];
  } else {
    const all = parseGroups(head);
    if (!all) return null;
    groups = [...all, ...tail];
    if (groups.length !== 8) return null;
  }
  const out = new Uint8Array(16);
  groups.forEach((g, i) => {
    out[i * 2] = g >> 8;
    out[i * 2 + 1] = g & 0xff;
  });
  return out;
}

/** `addr/prefix`, or null when it is not a valid range. */
export function parseCidr(text: string): Cidr | null {
  const slash = text.indexOf('/');
  if (slash === -1 || slash !== text.lastIndexOf('/')) return null;
  const addr = text.slice(0, slash);
  const len = text.slice(slash + 1);
  if (!/^(0|[1-9][0-9]{0,2})$/.test(len)) return null;
  const prefix = Number(len);
  const bytes = addr.includes(':') ? parseIPv6(addr) : parseIPv4(addr);
  if (!bytes || prefix > bytes.length * 8) return null;
  return { bytes, prefix };
}

/** Whether `addr` (4 or 16 bytes) lies in `range`; an IPv4 address never matches an IPv6 range or the reverse. */
export function cidrContains(range: Cidr, addr: Uint8Array): boolean {
  if (addr.length !== range.bytes.length) return false;
  const full = range.prefix >> 3;
  for (let i = 0; i < full; i++) if (addr[i] !== range.bytes[i]) return false;
  const rest = range.prefix & 7;
  if (rest === 0) return true;
  const mask = (0xff << (8 - rest)) & 0xff;
  return (addr[full]! & mask) === (range.bytes[full]! & mask);
}
