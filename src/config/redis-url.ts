/**
 * The forms of `redis.url` (DESIGN section 2), parsed without connecting. Pure, so that
 * `check-config` refuses exactly the URLs the limiter's client would refuse at start:
 *   redis://[user:pass@]host[:port][/db]          single node (rediss:// for TLS)
 *   redis+cluster://[user:pass@]host:port,host:port,...   Redis Cluster, seed nodes
 *                                                (rediss+cluster:// for TLS)
 *   unix:///path/to/redis.sock                   single node over a unix socket
 */

const validPort = (p: number): boolean => Number.isInteger(p) && p >= 1 && p <= 65535;

function decodeCredential(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    throw new Error('redis.url user or password has a malformed %-escape');
  }
}

/** A single node's URL: a host, a port in range when given, a numeric database when given. */
function checkSingle(url: string): RedisTarget {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error('redis.url is not a valid URL');
  }
  if (!parsed.hostname) throw new Error('redis.url needs a host, as in redis://host:6379');
  if (parsed.port !== '' && !validPort(Number(parsed.port))) throw new Error('redis.url port must be between 1 and 65535');
  if (!/^(\/\d*)?$/.test(parsed.pathname)) throw new Error('redis.url path must be a database number, as in redis://host:6379/0');
  return { kind: 'single', url };
}

export type RedisTarget =
  | { kind: 'single'; url: string }
  | { kind: 'unix'; path: string }
  | { kind: 'cluster'; nodes: { host: string; port: number }[]; username?: string; password?: string; tls: boolean };

export function parseRedisUrl(url: string): RedisTarget {
  const m = /^([a-z+]+):\/\/(.*)$/i.exec(url.trim());
  if (!m) throw new Error('redis.url must look like redis://host:port, redis+cluster://host:port,host:port or unix:///path');
  const scheme = m[1]!.toLowerCase();
  const rest = m[2]!;
  if (scheme === 'redis' || scheme === 'rediss') return checkSingle(url);
  if (scheme === 'unix') {
    if (!rest.startsWith('/')) throw new Error('redis.url unix:// needs an absolute socket path');
    return { kind: 'unix', path: rest };
  }
  if (scheme !== 'redis+cluster' && scheme !== 'rediss+cluster') {
    throw new Error(`redis.url scheme ${scheme}:// is not supported`);
  }
  const at = rest.lastIndexOf('@');
  const auth = at >= 0 ? rest.slice(0, at) : '';
  const hosts = (at >= 0 ? rest.slice(at + 1) : rest).replace(/\/.*$/, '');
  const nodes = hosts.split(',').filter(Boolean).map((hp) => {
    const hm = /^\[?([^\]]+?)\]?:(\d{1,5})$/.exec(hp.trim());
    if (!hm || !validPort(Number(hm[2]))) throw new Error('redis.url cluster nodes must be host:port, separated by commas');
    return { host: hm[1]!, port: Number(hm[2]) };
  });
  if (nodes.length === 0) throw new Error('redis.url cluster needs at least one host:port');
  const target: RedisTarget = { kind: 'cluster', nodes, tls: scheme === 'rediss+cluster' };
  if (auth) {
    const colon = auth.indexOf(':');
    const user = decodeCredential(colon >= 0 ? auth.slice(0, colon) : '');
    const pass = decodeCredential(colon >= 0 ? auth.slice(colon + 1) : auth);
    if (user) target.username = user;
    if (pass) target.password = pass;
  }
  return target;
}

