/**
 * Header lines on the way through (DESIGN section 5, "Headers"): what belongs to one
 * connection and is dropped both ways, and the request's lines as the upstream gets them.
 */
import type { IncomingHttpHeaders } from 'node:http';

/**
 * A fixed set of lower-case header names, asked about names fresh from Node's parser. A
 * Set would hash each fresh name it is asked about (V8 has no hash for a string until one
 * is needed); here a name of a length no member has, most names, is refused by one array
 * read, and the rest by comparing a few strings.
 */
export class NameSet {
  /** the members of each length, at that index */
  private readonly byLength: (string[] | undefined)[] = [];

  constructor(names: Iterable<string>) {
    for (const name of names) {
      while (this.byLength.length <= name.length) this.byLength.push(undefined);
      const same = (this.byLength[name.length] ??= []);
      if (!same.includes(name)) same.push(name);
    }
  }

  has(name: string): boolean {
    const same = name.length < this.byLength.length ? this.byLength[name.length] : undefined;
    if (same === undefined) return false;
    for (let i = 0; i < same.length; i++) if (same[i] === name) return true;
    return false;
  }
}

/** Headers that belong to one connection (RFC 9110 section 7.6.1), never forwarded either way. */
export const HOP_BY_HOP_NAMES = ['connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'proxy-authorization', 'proxy-connection'];
const HOP_BY_HOP = new NameSet(HOP_BY_HOP_NAMES);

const KEPT_WHEN_NAMED = new Set(['content-length', 'transfer-encoding', 'host', 'authorization', 'x-api-key']);

/**
 * The header names a Connection value lists (lower case), for removal; never the message's
 * framing, Host, or the credential lines keyward reads (`authorization`, `x-api-key`): the
 * upstream gets the key that was checked, not none or only another it might fall back to.
 * A name that is hop-by-hop anyway may be left out.
 */
export function connectionTokens(value: string): string[] {
  // The values nearly every message carries name no header that is not dropped anyway.
  if (value.length <= 10) {
    const v = value.toLowerCase();
    if (v === 'keep-alive' || v === 'close') return [];
  }
  const out: string[] = [];
  for (const token of value.split(',')) {
    const name = token.trim().toLowerCase();
    if (name && !KEPT_WHEN_NAMED.has(name)) out.push(name);
  }
  return out;
}

/** The names every Connection line of `raw` lists, or null when none lists any. */
function namedByConnection(raw: readonly string[]): string[] | null {
  let named: string[] | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.length !== 10 || raw[i]!.toLowerCase() !== 'connection') continue;
    const tokens = connectionTokens(raw[i + 1]!);
    if (tokens.length > 0) (named ??= []).push(...tokens);
  }
  return named;
}

/**
 * Sets an own data property, also for a header called `__proto__` (an assignment would
 * set the object's prototype instead).
 */
function put(out: Record<string, string | string[]>, name: string, value: string | string[]): void {
  if (name === '__proto__') Object.defineProperty(out, name, { value, enumerable: true, writable: true, configurable: true });
  else out[name] = value;
}

/** What else shapes the outgoing lines besides the received ones. */
export interface OutgoingOptions {
  /** sent instead of the received traceparent line(s); null or absent: they pass unchanged */
  traceparent?: string | null;
  /**
   * The names of Node's own header object for the request (`Object.keys(req.headers)`):
   * each distinct name once, in lower case, already in V8's string table. Used only to
   * spare hashing fresh names: any list of distinct names gives the same lines.
   */
  known?: readonly string[];
}

/**
 * A request's raw lines as the header object Node's client sends: names in lower case in
 * their first order, a repeated name as a list of its values in order (each sent as a line
 * of its own), hop-by-hop headers and those Connection names left out. Node's own header
 * object joins most repeats and keeps only the first of others. `traceparent`, when given,
 * is the one line sent under that name, where the first received one stood (else last).
 * An ordinary object, not one without a prototype: V8 keeps those in dictionary mode, and
 * http-proxy-3 and Node's client copy and walk this object on every request. So names
 * inherited from Object.prototype (`constructor`, `toString`) are looked up as own only.
 */
export function outgoingHeaders(raw: readonly string[], opts: OutgoingOptions = {}): IncomingHttpHeaders {
  const traceparent = opts.traceparent ?? null;
  const known = opts.known ?? [];
  const named = namedByConnection(raw);
  const out: Record<string, string | string[]> = {};
  // While every line names the next of `known` in turn, no name has repeated (they are an
  // object's keys), and each line's name can be that known string, not a fresh one to hash.
  let k = 0;
  let inTurn = true;
  for (let i = 0; i < raw.length; i += 2) {
    let name = raw[i]!.toLowerCase();
    if (inTurn && k < known.length && known[k] === name) name = known[k++]!;
    else inTurn = false;
    if (HOP_BY_HOP.has(name) || (named !== null && named.includes(name))) continue;
    if (traceparent !== null && name === 'traceparent') {
      out[name] = traceparent;
      continue;
    }
    const value = raw[i + 1]!;
    const prev = !inTurn && Object.hasOwn(out, name) ? out[name] : undefined;
    if (prev === undefined) put(out, name, value);
    else if (typeof prev === 'string') put(out, name, [prev, value]);
    else prev.push(value);
  }
  if (traceparent !== null) out.traceparent = traceparent;
  return out as IncomingHttpHeaders;
}
