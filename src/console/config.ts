/**
 * The reference console's configuration (`keyward console --config FILE`). Strict like the
 * sidecar's: an unknown key, a wrong type or a missing value is an error naming its path.
 *
 * Secrets: tokens usually come in through `${VAR}` expansion. The master key is never in
 * the file at all, only the name of the environment variable that holds it, so a config
 * file can be shared or printed without exposing the key that decrypts every stored secret.
 */
import { z } from 'zod';
import { holdsKeyShape } from '../auth/keyformat.js';
import { host } from '../config/listen.js';
import { always, bearerToken, fraction, isRecord, num } from '../config/schema.js';

// Numbers also from `${VAR}` expansion, which yields strings (as in the sidecar's config).
const port = num().pipe(z.number().min(0).max(65535));
/** Long enough that a guessed or truncated token is not plausible. */
const token = bearerToken(z.string().min(16, 'tokens must be at least 16 characters'));
export const idPattern = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$/;
/** A key pasted where an id, a name or a glob belongs would go to every replica and log line. */
export const KEY_SHAPED_MESSAGE = 'holds what looks like a keyward key: a key is never an id, a name or a model';
export function notKeyShaped(text: string): boolean {
  return !holdsKeyShape(text);
}
/**
 * A model glob (key scopes, per-model limits, prices). The sidecar refuses model names with
 * a comma, whitespace or a control character (gateways read them as lists), so a glob with
 * one would match nothing it is ever asked about.
 */
export const modelGlob = z
  .string()
  .min(1)
  .max(256)
  .regex(/^[^\s,\x00-\x1f\x7f-\x9f]+$/, 'expected a model glob without commas, whitespace or control characters') // eslint-disable-line no-control-regex
  .refine(notKeyShaped, KEY_SHAPED_MESSAGE);
const principalId = z.string().regex(idPattern, 'expected an id of letters, digits, and . _ @ -').refine(notKeyShaped, KEY_SHAPED_MESSAGE);
const price = fraction.pipe(z.number().finite().nonnegative());

const priceEntry = z.strictObject({
  /** anchored glob over the model name; `*` matches any run of characters */
  match: modelGlob,
  inputPerMillion: price,
  outputPerMillion: price,
});

/** The entries of a list the schema may not have accepted (a wrong type reads as no entries). */
const entries = (v: unknown): [number, unknown][] => (Array.isArray(v) ? [...v.entries()] : []);
const field = (v: unknown, key: string): unknown => (isRecord(v) ? v[key] : undefined);

/**
 * One token, one role: a token shared between roles would make its holder's rights
 * ambiguous. One price per glob, one user per id. Runs beside every other problem, so it
 * reads fields of any type and compares only the strings.
 */
function checkUnique(c: unknown, ctx: z.RefinementCtx): void {
  const auth = field(c, 'auth');
  const seen = new Map<string, string>();
  const check = (t: unknown, where: (string | number)[]) => {
    if (typeof t !== 'string') return;
    const prev = seen.get(t);
    if (prev !== undefined) ctx.addIssue({ code: 'custom', message: `same token as ${prev}`, path: where });
    else seen.set(t, where.join('.'));
  };
  for (const [i, t] of entries(field(auth, 'syncTokens'))) check(t, ['auth', 'syncTokens', i]);
  for (const [i, t] of entries(field(auth, 'adminTokens'))) check(t, ['auth', 'adminTokens', i]);
  for (const [i, u] of entries(field(auth, 'users'))) check(field(u, 'token'), ['auth', 'users', i, 'token']);
  const once = (list: unknown, key: string, path: string[], message: (v: string) => string) => {
    const met = new Set<string>();
    for (const [i, item] of entries(list)) {
      const v = field(item, key);
      if (typeof v !== 'string') continue;
      if (met.has(v)) ctx.addIssue({ code: 'custom', message: message(v), path: [...path, i, key] });
      met.add(v);
    }
  };
  once(field(field(c, 'pricing'), 'models'), 'match', ['pricing', 'models'], (m) => `${m} is priced twice`);
  once(field(auth, 'users'), 'id', ['auth', 'users'], (id) => `user ${id} is listed twice`);
}

/**
 * A master key where its variable's name belongs (the file says `${KEYWARD_MASTER_KEY}`):
 * 32 or more hex digits, or a long run of mixed-case letters and digits as base64 gives. A
 * message naming the variable would print it.
 */
function looksLikeKeyMaterial(name: string): boolean {
  if (/^[0-9a-fA-F]{32,}$/.test(name)) return true;
  return name.length >= 40 && /[a-z]/.test(name) && /[A-Z]/.test(name) && /[0-9]/.test(name);
}

export const consoleConfigSchema = z
  .strictObject({
    listen: z
      .strictObject({ host: host.default('127.0.0.1'), port: port.default(7000) })
      .prefault({}),
    store: z.strictObject({ path: z.string().min(1).default('./data/console.sqlite') }).prefault({}),
    /** Name of the environment variable holding the AES-256-GCM master key (32 bytes: 64 hex, or base64). */
    masterKeyEnv: z
      .string()
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'expected an environment variable name')
      .refine((name) => !looksLikeKeyMaterial(name), 'holds what looks like the master key itself (`${KEYWARD_MASTER_KEY}` puts the value here): name the variable, e.g. KEYWARD_MASTER_KEY')
      .default('KEYWARD_MASTER_KEY'),
    /** Must match the sidecars' `keys.hash` and `keys.pepper`, or no key will authenticate. */
    keys: z
      .strictObject({
        hash: z.enum(['sha256', 'hmac-sha256']).default('sha256'),
        pepper: z.string().min(16, 'the pepper must be at least 16 characters').optional(),
      })
      .prefault({})
      .refine((k) => !isRecord(k) || k.hash !== 'hmac-sha256' || k.pepper !== undefined, {
        message: 'hash hmac-sha256 needs a pepper',
        path: ['pepper'],
        ...always,
      }),
    auth: z.strictObject({
      /** bearer tokens the sidecars use on /sync/v1/* */
      syncTokens: z.array(token).min(1),
      /** bearer tokens that may do everything on /admin/v1/* */
      adminTokens: z.array(token).min(1),
      /** people: may list, show and reveal their own personal keys and their projects' keys */
      users: z.array(z.strictObject({ id: principalId, token })).default([]),
    }),
    sync: z
      .strictObject({
        /** how many changes the feed keeps; a cursor older than that is answered 410 (take a snapshot) */
        retainChanges: num().pipe(z.number().min(1)).default(100_000),
        /**
         * most changes in one /changes answer; the sidecar asks again at once for the rest. Kept
         * small so each answer applies on the sidecar's event loop without holding up its
         * requests (larger ones go to a worker thread, which adds its start-up time).
         */
        maxBatch: num().pipe(z.number().min(1).max(100_000)).default(200),
        /** largest accepted POST /sync/v1/usage body */
        maxUsageBytes: num().pipe(z.number().positive()).default(8 * 1024 * 1024),
      })
      .prefault({}),
    pricing: z.strictObject({
      /**
       * published to sidecars as `price` records; the most specific entry wins (an exact
       * name, then the longest glob), whatever the order
       */
      models: z.array(priceEntry).default([]),
      /** what usage of a model no entry matches (or with no model) costs; deliberately required */
      unpriced: z.strictObject({ inputPerMillion: price, outputPerMillion: price }),
    }),
    logging: z.strictObject({ level: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info') }).prefault({}),
  })
  .superRefine(checkUnique, always);

export type ConsoleConfig = z.infer<typeof consoleConfigSchema>;
export type ConsoleConfigInput = z.input<typeof consoleConfigSchema>;
