/**
 * URLs in config that keyward itself calls or forwards to. Each is refused at check-config
 * when the call could never be made with it, rather than failing on every attempt later.
 */
import { z } from 'zod';

export const httpUrl = z.url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL' });

/** A URL with user-info (`user:password@`) before its host. */
const USER_INFO = /^https?:\/\/[^/?#]*@/i;

/**
 * The ports the Fetch standard calls "bad ports": Node's fetch refuses to connect to
 * them, so a URL on one fails every call.
 */
export const BAD_FETCH_PORTS: ReadonlySet<number> = new Set([
  1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95, 101, 102, 103, 104, 109, 110, 111,
  113, 115, 117, 119, 123, 135, 137, 139, 143, 161, 179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532, 540, 548,
  554, 556, 563, 587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566, 6665,
  6666, 6667, 6668, 6669, 6679, 6697, 10080,
]);

/** The URL's port when fetch refuses it, else null (also for a URL that does not parse: that is reported apart). */
function badFetchPort(url: string): number | null {
  let port: number;
  try {
    port = Number(new URL(url).port);
  } catch {
    return null;
  }
  return BAD_FETCH_PORTS.has(port) ? port : null;
}

/**
 * A URL keyward's fetch calls. Node's fetch refuses a URL with user-info, and its error
 * (which a log line would quote) names the whole URL; `secret` is what authenticates instead.
 */
export const fetchUrl = (secret: string) =>
  httpUrl
    .refine((u) => !USER_INFO.test(u), { message: `expected no user-info (user:password@): Node's fetch refuses it; ${secret} authenticates the calls` })
    .superRefine((u, ctx) => {
      const port = badFetchPort(u);
      if (port !== null) ctx.addIssue({ code: 'custom', message: `port ${port} is one Node's fetch refuses to connect to (a "bad port" of the Fetch standard): use another port` });
    });

/** A base URL a path is appended to: a query or a fragment would end up before that path. */
export const baseUrl = <S extends z.ZodType<string>>(url: S, appended: string): S =>
  url.refine((u) => !/[?#]/.test(u), { message: `expected a base URL without ?query or #fragment: the path ${appended} is appended to it` });

/**
 * An upstream's URL: its path and query go before every forwarded request's; user-info
 * (Node's client would drop it, sending no Basic auth) and a fragment have no meaning here.
 */
export const upstreamUrl = httpUrl.refine((u) => !USER_INFO.test(u) && !u.includes('#'), {
  message: 'expected no user-info (user:password@) and no #fragment: keyward forwards the client\'s own credentials',
});
