/**
 * What the fuzzer generates beyond bodies and credentials (paths with Unicode look-alikes,
 * encoded bytes and empty segments; repeated header lines), and the second readings of
 * what reached the upstream: the path as a folding, slash-merging upstream reads it.
 */

/** A seeded generator (mulberry32), so a failing seed can be replayed. */
export function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, pick: <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)]!, chance: (p: number) => next() < p };
}
export type Rng = ReturnType<typeof prng>;

/** Characters some upstreams fold into a dot or a slash (NFKC, or a lenient UTF-8 decoder). */
const DOT_LIKE = ['\uff0e', '\u2024', '\ufe52', '\u3002'];
const SLASH_LIKE = ['\uff0f', '\u2215', '\u2044', '\u29f8'];
/** Overlong UTF-8 encodings of '.' and '/' that lenient decoders accept. */
const OVERLONG: Record<string, string> = { '%C0%AE': '.', '%c0%ae': '.', '%C0%AF': '/', '%c0%af': '/', '%E0%80%AE': '.' };

const encode = (s: string) => [...Buffer.from(s, 'utf8')].map((b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`).join('');

/** A route-changing insertion: look-alike dots and slashes, raw or percent-encoded, or empty segments. */
export function trickyPath(r: Rng, base: string): { path: string; kind: string } {
  const dot = r.pick(DOT_LIKE);
  const slash = r.pick(SLASH_LIKE);
  const raw = r.chance(0.3);
  const enc = (s: string) => (raw ? s : encode(s));
  const kind = r.pick(['lookalike-dotdot', 'lookalike-slash', 'two-dot-leader', 'overlong', 'empty-segment', 'trailing-slash', 'encoded-unreserved', 'plain']);
  switch (kind) {
    case 'lookalike-dotdot':
      return { kind, path: `${base}${enc(slash)}${enc(dot + dot)}${enc(slash)}files${enc(slash)}f1` };
    case 'lookalike-slash':
      return { kind, path: `/v1${enc(slash)}files${enc(slash)}f1` };
    case 'two-dot-leader':
      return { kind, path: `${base}/${enc('\u2025')}/files/f1` };
    case 'overlong': {
      const o = r.pick(Object.keys(OVERLONG));
      return { kind, path: `${base}/${o}${o}/files` };
    }
    case 'empty-segment':
      return { kind, path: base.replace(/^\/v1\//, r.pick(['/v1//', '/v1///'])) };
    case 'trailing-slash':
      return { kind, path: `${base}/` };
    case 'encoded-unreserved':
      return { kind, path: base.replace(/[a-z]/, (c) => `%${c.charCodeAt(0).toString(16)}`) };
    default:
      return { kind, path: base };
  }
}

/** Percent-decodes to bytes, reading overlong encodings of '.' and '/' as a lenient decoder does. */
function decodeLeniently(path: string): string {
  let s = path;
  for (const [o, c] of Object.entries(OVERLONG)) s = s.split(o).join(c);
  const bytes: number[] = [];
  for (let i = 0; i < s.length; i++) {
    const m = /^%([0-9A-Fa-f]{2})/.exec(s.slice(i));
    if (m) {
      bytes.push(Number.parseInt(m[1]!, 16));
      i += 2;
    } else {
      for (const b of Buffer.from(s[i]!, 'utf8')) bytes.push(b);
    }
  }
  return Buffer.from(bytes).toString('utf8');
}

/**
 * The path a folding, slash-merging upstream routes: decoded (leniently), NFKC-folded with
 * the slash look-alikes NFKC leaves alone, slashes merged, dot segments resolved, a
 * trailing slash dropped.
 */
export function upstreamReading(url: string): string {
  const q = url.indexOf('?');
  let p = decodeLeniently(q === -1 ? url : url.slice(0, q)).normalize('NFKC');
  for (const c of SLASH_LIKE) p = p.split(c).join('/');
  p = p.replace(/\u3002/g, '.').replace(/\\/g, '/').replace(/\/{2,}/g, '/');
  const out: string[] = [];
  for (const seg of p.split('/').slice(1)) {
    if (seg === '..') out.pop();
    else if (seg !== '.') out.push(seg);
  }
  const joined = `/${out.join('/')}`;
  return joined.length > 1 && joined.endsWith('/') ? joined.slice(0, -1) : joined;
}

/** A block of repeated non-credential header lines, and the values the upstream must read in order. */
export function repeatedLines(r: Rng): { block: string; expect: [string, string[]][] } {
  const pick = r.pick([
    ['X-Dup', ['a', 'b, c', 'd']],
    ['User-Agent', ['first/1', 'second/2']],
    ['Accept', ['application/json', 'text/event-stream']],
    ['X-Forwarded-For', ['10.0.0.1', '10.0.0.2']],
    ['Cookie', ['a=1', 'b=2']],
  ] as const);
  const [name, values] = pick;
  const block = values.map((v) => `${r.chance(0.5) ? name.toLowerCase() : name}: ${v}\r\n`).join('');
  return { block, expect: [[name.toLowerCase(), [...values]]] };
}

/** The values of every raw line named `name` (lower case), in order. */
export function rawValues(raw: readonly string[], name: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === name) out.push(raw[i + 1]!);
  return out;
}
