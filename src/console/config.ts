/**
 * The reference console's configuration (`keyward console --config FILE`). Strict like the
 * sidecar's: an unknown key, a wrong type or a missing value is an error naming its path.
 *
 * Secrets: tokens usually come in through `${VAR}` expansion. The master key is never in
 * the file at all, only the name of the environment variable that holds it, so a config
 * file can be shared or printed without exposing the key that decrypts every stored secret.
 */
import { z } from 'zod';
import { always, fraction, isRecord, num } from '../config/schema.js';

// Numbers also from `${VAR}` expansion, which yields strings (as in the sidecar's config).
const port = num().pipe(z.number().min(0).max(65535));
/** Long enough that a guessed or truncated token is not plausible. */
const token = z.string().min(16, 'tokens must be at least 16 characters');
export const idPattern = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$/;
/**
 * A model glob (key scopes, per-model limits, prices). The sidecar refuses model names with
 * a comma, whitespace or a control character (gateways read them as lists), so a glob with
 * one would match nothing it is ever asked about.
 */
export const modelGlob = z
  .string()
  .min(1)
  .max(256)
  .regex(/^[^\s,\x00-\x1f\x7f-\x9f]+$/, 'expected a model glob without commas, whitespace or control characters'); // eslint-disable-line no-control-regex
const principalId = z.string().regex(idPattern, 'expected an id of letters, digits, and . _ @ -');
const price = fraction.pipe(z.number().finite().nonnegative());

const priceEntry = z.strictObject({
  /** anchored glob over the model name; `*` matches any run of characters */
  match: modelGlob,
  inputPerMillion: price,
  outputPerMillion: price,
});

export const consoleConfigSchema = z
  .strictObject({
    listen: z
      .strictObject({ host: z.string().min(1).default('127.0.0.1'), port: port.default(7000) })
      .prefault({}),
    store: z.strictObject({ path: z.string().min(1).default('./data/console.sqlite') }).prefault({}),
    /** Name of the environment variable holding the AES-256-GCM master key (32 bytes: 64 hex, or base64). */
    masterKeyEnv: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'expected an environment variable name').default('KEYWARD_MASTER_KEY'),
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
  .superRefine((c, ctx) => {
    // One token, one role: a token shared between roles would make its holder's rights ambiguous.
    const seen = new Map<string, string>();
    const check = (t: string, where: (string | number)[]) => {
      const prev = seen.get(t);
      if (prev !== undefined) ctx.addIssue({ code: 'custom', message: `same token as ${prev}`, path: where });
      else seen.set(t, where.join('.'));
    };
    c.auth.syncTokens.forEach((t, i) => check(t, ['auth', 'syncTokens', i]));
    c.auth.adminTokens.forEach((t, i) => check(t, ['auth', 'adminTokens', i]));
    c.auth.users.forEach((u, i) => check(u.token, ['auth', 'users', i, 'token']));
    const globs = new Set<string>();
    c.pricing.models.forEach((m, i) => {
      // one price record per glob: two entries for one glob would leave the price ambiguous
      if (globs.has(m.match)) ctx.addIssue({ code: 'custom', message: `${m.match} is priced twice`, path: ['pricing', 'models', i, 'match'] });
      globs.add(m.match);
    });
    const ids = new Set<string>();
    c.auth.users.forEach((u, i) => {
      if (ids.has(u.id)) ctx.addIssue({ code: 'custom', message: `user ${u.id} is listed twice`, path: ['auth', 'users', i, 'id'] });
      ids.add(u.id);
    });
  });

export type ConsoleConfig = z.infer<typeof consoleConfigSchema>;
export type ConsoleConfigInput = z.input<typeof consoleConfigSchema>;
