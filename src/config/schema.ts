/**
 * The sidecar's configuration (DESIGN section 2). Strict: unknown keys are errors.
 * Defaults are the ones the design lists. Pure: no I/O.
 */
import { z } from 'zod';
import { parseRange } from '../policy/network.js';
import { SHADOW_CHECKS } from '../protocol/shadow-checks.js';
import { parseRedisUrl } from './redis-url.js';
import { builtInRoute, checkPath } from '../routes.js';
import { host, hostsOverlap } from './listen.js';
import { baseUrl, fetchUrl, httpUrl, upstreamUrl } from './urls.js';

/**
 * Numbers also accept numeric strings, which is what `${VAR}` expansion yields. Whole
 * numbers are checked by a refinement: zod's own integer check stops every check that
 * compares fields, anywhere above it, so a `1.5` would hide the other problems.
 */
export const num = () =>
  z.preprocess((v) => (typeof v === 'string' && /^-?\d+$/.test(v.trim()) ? Number(v) : v), z.number().refine(Number.isSafeInteger, { message: 'expected a whole number' }));
const bool = () => z.preprocess((v) => (v === 'true' ? true : v === 'false' ? false : v), z.boolean());
const port = num().pipe(z.number().min(0).max(65535));
/** redis.url, parsed as the limiter's client parses it. */
const redisUrl = z.string().superRefine((url, ctx) => {
  try {
    parseRedisUrl(url);
  } catch (err) {
    ctx.addIssue({ code: 'custom', message: (err as Error).message });
  }
});
/** The longest a Node timer waits: a longer delay fires at once (TimeoutOverflowWarning). */
const MAX_TIMER_MS = 2_147_483_647;
const timerMs = () => z.number().max(MAX_TIMER_MS, `expected at most ${MAX_TIMER_MS} (about 24.8 days): Node's timers cannot wait longer`);
const ms = (def: number) => num().pipe(timerMs().nonnegative()).default(def);
const atMost = (max: number) => `expected at most ${max}`;
/**
 * A bearer token as an HTTP header carries it: visible ASCII, no spaces. A token read from a
 * secret file with its trailing newline could never be sent (or matched), so it is refused
 * here rather than met as a 401 or a failed request at run time.
 */
export const bearerToken = (s: z.ZodString) => s.regex(/^[\x21-\x7e]*$/, 'expected visible ASCII characters without spaces (a trailing newline from a secret file?)');
/** A fraction such as 0.8; also from a numeric string, as `${VAR}` expansion yields. */
export const fraction = z.preprocess((v) => (typeof v === 'string' && v.trim() !== '' && !Number.isNaN(Number(v)) ? Number(v) : v), z.number());
/**
 * Runs a check that compares fields even when other parts of its value have problems, so
 * every problem is reported at once (zod skips the refinements of a value with issues).
 * Such a check may then see fields of the wrong type, so it tests each type it reads.
 */
export const always = { when: () => true } as const;
export const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null;

const capacity = z
  .strictObject({
    concurrency: num().pipe(z.number().nonnegative()).default(0),
    rpm: num().pipe(z.number().nonnegative()).default(0),
  })
  .prefault({});

const upstream = z.strictObject({
  url: upstreamUrl,
  timeoutMs: ms(600_000),
  capacity,
});

/** The URL DESIGN section 2 gives the `default` upstream when its entry names none; other modes name their own. */
const DEFAULT_UPSTREAM_URL = 'http://127.0.0.1:4000';
/** `replica.path` when the config names none; also where `keyward import` writes without a config */
export const DEFAULT_REPLICA_PATH = './data/replica.sqlite';
function defaultUpstreamUrl(u: unknown, ctx: { addIssue(issue: { code: 'custom'; message: string; path: string[] }): void }): unknown {
  // The record would drop a mode of this name unchecked.
  if (isRecord(u) && Object.hasOwn(u, '__proto__')) ctx.addIssue({ code: 'custom', message: 'expected a routing mode name other than __proto__', path: ['__proto__'] });
  if (!isRecord(u) || !isRecord(u.default) || u.default.url !== undefined) return u;
  return { ...u, default: { ...u.default, url: DEFAULT_UPSTREAM_URL } };
}

const MODE_NAME = /^[A-Za-z0-9_.-]+$/;

/**
 * The names of the routing modes. Checked here rather than by the record's key schema,
 * which would leave the value of a badly named mode unchecked.
 */
function checkModes(u: unknown, ctx: z.RefinementCtx): void {
  if (!isRecord(u) || Array.isArray(u)) return;
  if (!Object.hasOwn(u, 'default')) ctx.addIssue({ code: 'custom', message: 'upstreams.default is required' });
  for (const name of Object.keys(u)) {
    if (!MODE_NAME.test(name)) ctx.addIssue({ code: 'custom', message: 'expected a routing mode name: letters, digits, `_`, `.` and `-`', path: [name] });
  }
}

/** Operator-added routes, matched after the default table. */
const HTTP_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;

/** Why an operator route could never match a request the path check lets through, or null. */
function routePathProblem(path: string): string | null {
  const bare = path.endsWith('/*') ? path.slice(0, -2) : path;
  if (bare.includes('*')) return 'a "*" may only end a path, as "/*" (a prefix)';
  if (bare === '') return null; // `/*`: every path
  if (path === '/v1/key') return '/v1/key is keyward\'s own (GET answers the caller\'s key, other methods are 404) and cannot be routed';
  const checked = checkPath(bare);
  return checked.ok ? null : `no request could match this path: ${checked.message}`;
}

const routeEntry = z.strictObject({
  /** exact path, or a prefix when it ends in `/*` (the bare prefix matches too) */
  path: z
    .string()
    .regex(/^\/[^?#\s]*$/, 'expected a path starting with /')
    .superRefine((path, ctx) => {
      const problem = routePathProblem(path);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }),
  methods: z.array(z.enum(HTTP_METHODS, { error: `expected one of ${HTTP_METHODS.join(', ')}` })).min(1).optional(),
  class: z.enum(['listing', 'model', 'files']),
  credentials: z.enum(['bearer', 'messages']).default('bearer'),
  style: z.enum(['openai', 'messages']).default('openai'),
  countTokens: bool().default(false),
  modelRequired: bool().default(false),
}).superRefine((entry, ctx) => {
  // Operator routes extend the table: one whose every method the built-in table answers would never be reached.
  if (entry.path.endsWith('/*') || routePathProblem(entry.path) || entry.methods?.length === 0) return;
  const taken = (entry.methods ?? HTTP_METHODS).map((m) => builtInRoute(m, entry.path));
  if (taken.every((name) => name !== null)) {
    const names = [...new Set(taken)].join(', ');
    ctx.addIssue({ code: 'custom', path: ['path'], message: `the built-in route ${names} already answers ${entry.methods ? 'these methods' : 'every method'} on this path; operator routes add paths and methods, never replace a built-in route` });
  }
});

export const configSchema = z
  .strictObject({
    server: z
      .strictObject({
        host: host.default('127.0.0.1'),
        port: port.default(8080),
        /** JSON model-request bodies only: they are read whole to find the model */
        maxJsonBodyBytes: num().pipe(z.number().positive()).default(33_554_432),
        /** multipart and files bodies, which stream through unbuffered; 0 = no limit */
        maxUploadBytes: num().pipe(z.number().nonnegative()).default(0),
        /** CIDRs of proxies in front of keyward whose X-Forwarded-For is believed */
        trustedProxies: z.array(z.string().refine((c) => parseRange(c) !== null, { message: 'expected a CIDR such as 10.0.0.0/8 or 2001:db8::/32' })).default([]),
        /** refuse requests that carry Origin or Sec-Fetch-Mode unless the key allows browsers */
        refuseBrowsers: bool().default(true),
        /** a request body with no byte for this long is cut with 408 (0 = never) */
        bodyIdleTimeoutMs: ms(60_000),
        /** SIGTERM: how long in-flight requests and streams may take to finish */
        shutdownGraceMs: ms(30_000),
      })
      .prefault({}),
    admin: z.strictObject({ host: host.default('127.0.0.1'), port: port.default(9090) }).prefault({}),
    upstreams: z.preprocess(defaultUpstreamUrl, z.record(z.string(), upstream).superRefine(checkModes, always)),
    replica: z.strictObject({ path: z.string().min(1).default(DEFAULT_REPLICA_PATH) }).prefault({}),
    console: z
      .strictObject({
        url: baseUrl(fetchUrl('the sync token'), '/sync/v1/...').default('http://127.0.0.1:7000'),
        token: bearerToken(z.string({ error: (iss) => (iss.input === undefined ? 'required: the sync token (or KEYWARD_SYNC_TOKEN in the environment)' : 'expected a string') }).min(1, 'the sync token must not be empty')),
        waitMs: num().pipe(z.number().min(0).max(60_000, atMost(60_000))).default(25_000),
      })
      .optional(),
    /** The defaults of `redis` and `limits.leaseMs` are stated here only: createLimiter (src/limits/create.ts) takes every value as given. */
    redis: z
      .strictObject({
        url: redisUrl.default('redis://127.0.0.1:6379'),
        prefix: z.string().min(1).default('kw'),
        timeoutMs: num().pipe(timerMs().positive()).default(100),
        onError: z.enum(['open', 'closed']).default('open'),
        /** bucket slices: an instance admits a key far from its limit from a leased slice, without a round trip */
        lease: z
          .strictObject({
            enabled: bool().default(true),
            sliceMs: num().pipe(z.number().min(10).max(60_000, atMost(60_000))).default(1000),
          })
          .prefault({}),
      })
      .optional(),
    limits: z
      .strictObject({
        /** concurrency slot lease; refreshed while a response lasts, so a crashed instance's slots come back */
        leaseMs: num().pipe(timerMs().min(1000)).default(30_000),
        /** output tokens reserved (and held for budgets) when a request names no output cap */
        defaultOutputTokens: num().pipe(z.number().nonnegative()).default(1024),
        /** checks evaluated but not enforced, for every key (DESIGN section 12); a key record's own `shadow` adds to them */
        shadow: z.array(z.enum(SHADOW_CHECKS)).default([]),
      })
      .prefault({}),
    keys: z
      .strictObject({
        hash: z.enum(['sha256', 'hmac-sha256']).default('sha256'),
        pepper: z.string().min(16, 'the pepper must be at least 16 characters').optional(),
        format: z.enum(['any', 'keyward']).default('any'),
      })
      .prefault({})
      .refine((k) => !isRecord(k) || k.hash !== 'hmac-sha256' || k.pepper !== undefined, {
        message: 'keys.pepper is required with hash: hmac-sha256 (or KEYWARD_KEY_PEPPER in the environment)',
        path: ['pepper'],
        ...always,
      }),
    messages: z
      .strictObject({ vendor: z.string().regex(/^[a-z0-9-]+$/, 'expected a lower-case header-name prefix').default('keyward') })
      .prefault({}),
    logging: z
      .strictObject({ level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info') })
      .prefault({}),
    routes: z.array(routeEntry).default([]),
    /** OpenTelemetry traces (DESIGN section 13); without this block nothing of the SDK is loaded */
    tracing: z
      .strictObject({
        /** the collector's OTLP/HTTP base URL: spans go to `<otlpUrl>/v1/traces` */
        otlpUrl: baseUrl(httpUrl, '/v1/traces').default('http://127.0.0.1:4318'),
        /** share of new traces sampled; a request with a traceparent follows its sampled flag */
        sampleRatio: z.preprocess((v) => (typeof v === 'string' && v.trim() !== '' && !Number.isNaN(Number(v)) ? Number(v) : v), z.number().min(0).max(1)).default(1),
        /** the forwarded traceparent names keyward's span as parent */
        propagate: bool().default(true),
      })
      .optional(),
    /** Budget alerts (DESIGN section 13); without this block nothing is watched or sent */
    alerts: z
      .strictObject({
        /** where each `budget.threshold` event is POSTed */
        webhookUrl: fetchUrl('alerts.secret'),
        /** fractions of a budget (of a wallet's balance at its epoch), each alerted once per epoch */
        thresholds: z
          .array(fraction.pipe(z.number().gt(0, 'expected a fraction above 0').max(1, 'expected a fraction of at most 1')))
          .min(1, 'expected at least one threshold')
          .refine((ts) => ts.every((t, i) => i === 0 || t > ts[i - 1]!), { message: 'expected thresholds in ascending order, each once, e.g. [0.8, 0.95, 1]' })
          .default([0.8, 0.95, 1]),
        /** signs each body: `x-keyward-signature: sha256=<hex HMAC-SHA256 of the body>` */
        secret: z.string().min(1, 'the secret must not be empty').optional(),
      })
      .optional(),
  })
  .refine((c) => !listenersCollide(c), { path: ['admin', 'port'], message: 'the admin listener must not share the proxy port', ...always });

/** Whether the proxy and admin listeners would bind the same port (fields of the wrong type: no). */
function listenersCollide(c: unknown): boolean {
  if (!isRecord(c) || !isRecord(c.server) || !isRecord(c.admin)) return false;
  const { host: sh, port: sp } = c.server;
  const { host: ah, port: ap } = c.admin;
  if (typeof sh !== 'string' || typeof ah !== 'string' || typeof sp !== 'number' || sp === 0 || sp !== ap) return false;
  return hostsOverlap(sh, ah);
}

export type Config = z.infer<typeof configSchema>;
export type RouteEntry = z.infer<typeof routeEntry>;
export type UpstreamConfig = z.infer<typeof upstream>;
export type AlertsConfig = NonNullable<Config['alerts']>;
