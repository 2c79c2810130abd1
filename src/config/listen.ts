/**
 * Listener addresses in config (the sidecar's proxy and admin listeners, the console's):
 * what a host may be, and whether two listeners would bind the same address. Pure, so
 * check-config refuses what serve could not bind, without resolving any name.
 */
import { z } from 'zod';
import { parseIp, parseRange } from '../policy/network.js';

/** An IP address or a DNS name: what a listener can bind, so check-config refuses what serve could not. */
const HOSTNAME = /^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const unbracketed = (h: string): string => h.replace(/^\[(.*)\]$/, '$1');

/**
 * A name whose last label is a number is an IPv4 address in one of the forms the resolver
 * also reads (`127.1`, `2130706433`, `0177.0.0.1` octal, `0x7f.1`), which the listener clash
 * check would take for a name: only the four-decimal form is accepted.
 */
const NUMERIC_LAST = /(?:^|\.)(?:\d+|0x[0-9a-f]*)$/i;

/** `[::1]` is accepted as written in a URL and kept as `::1`, the form `listen()` binds. */
export const host = z
  .string()
  .superRefine((h, ctx) => {
    const ip = parseRange(unbracketed(h)) !== null;
    if (!ip && NUMERIC_LAST.test(h)) ctx.addIssue({ code: 'custom', message: 'an IPv4 address is written as four decimal parts without leading zeros (127.0.0.1)' });
    else if (h.includes('/') || (!ip && !HOSTNAME.test(h))) ctx.addIssue({ code: 'custom', message: 'expected an IP address or a host name' });
  })
  .transform(unbracketed);

const addressKey = (ip: Uint8Array): string => ip.join('.');
const LOOPBACKS = [addressKey(parseIp('127.0.0.1')!), addressKey(parseIp('::1')!)];

/**
 * What a listener on `h` binds: every address (`any`), or the addresses it may take.
 * `localhost` resolves to either loopback address, whichever the resolver gives first;
 * any other name stands for itself, as the schema resolves nothing.
 */
function boundBy(h: string): 'any' | string[] {
  const name = unbracketed(h).toLowerCase();
  if (name === 'localhost') return LOOPBACKS;
  const ip = parseIp(name);
  if (!ip) return [name];
  return ip.every((b) => b === 0) ? 'any' : [addressKey(ip)];
}

/** Whether listeners on these two hosts would bind a common address (on one port, a clash). */
export function hostsOverlap(a: string, b: string): boolean {
  const [x, y] = [boundBy(a), boundBy(b)];
  return x === 'any' || y === 'any' || x.some((k) => y.includes(k));
}
