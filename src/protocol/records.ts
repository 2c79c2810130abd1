/**
 * Console sync protocol v1 (DESIGN section 7): record shapes, change batches and their
 * validators. Pure: no I/O. Shared by the sidecar (import, sync client, replica) and the
 * reference console.
 */
import { z } from 'zod';
import { knownShadowChecks } from './shadow-checks.js';
import { parseCidr } from './cidr.js';

// Records are objects, not strict objects: a reader ignores fields it does not know
// (section 7), so a newer console can add fields without breaking older sidecars. Fields
// it does know are validated strictly, and v1 additions take their defaults when absent
// or null: a console whose language writes an unset optional field as null (Go's
// pointers, Python's None) means the same, and one such record must not stop the sync.

const id = z.string().min(1).max(256);
const amount = z.number().finite();
const nullableCount = z.number().int().nonnegative().nullable();
const epoch = z.number().int().nonnegative().nullable().default(0).transform((v) => v ?? 0);
/** UTC calendar period of a budget; null: the budget never restarts by itself */
export const budgetPeriod = z.enum(['day', 'week', 'month']).nullable();
const modelGlob = z.string().min(1).max(256);

// Many keys share the same few ranges: a snapshot of a million keys checks each range once.
const knownCidrs = new Set<string>();
function isCidr(s: string): boolean {
  if (knownCidrs.has(s)) return true;
  if (parseCidr(s) === null) return false;
  if (knownCidrs.size >= 10_000) knownCidrs.clear();
  knownCidrs.add(s);
  return true;
}

export const cidr = z.string().max(64).refine(isCidr, { message: 'expected a CIDR range such as 10.0.0.0/8 or 2001:db8::/32' });

export const modelLimit = z.object({
  /** anchored glob, `*` the only wildcard; the first matching entry applies */
  models: modelGlob,
  rpm: nullableCount.default(null),
  tpm: nullableCount.default(null),
});

export const projectRecord = z.object({
  type: z.literal('project'),
  id,
  status: z.enum(['enabled', 'disabled']),
  budget: amount.nonnegative().nullable(),
  spent: amount,
  epoch,
  /** not in the agreed v1 list for projects, but carried so a project budget's period can be shown */
  period: budgetPeriod.default(null),
});

export const walletRecord = z.object({
  type: z.literal('wallet'),
  user: id,
  balance: amount,
  epoch,
});

export const keyRecord = z
  .object({
    type: z.literal('key'),
    id,
    // Looked up as the sidecar spells a digest (lowercase); a console that writes it in capitals means the same hash.
    hash: z.string().regex(/^[0-9a-fA-F]{64}$/, 'expected 64 hex characters').transform((h) => h.toLowerCase()),
    kind: z.enum(['personal', 'team']),
    user: id.nullable(),
    project: id.nullable(),
    status: z.enum(['active', 'deleted']),
    budget: amount.nonnegative().nullable(),
    spent: amount,
    models: z.array(modelGlob).nullable(),
    routing: z.string().min(1).max(64).nullable(),
    rpm: nullableCount,
    tpm: nullableCount,
    concurrency: nullableCount,
    epoch,
    ips: z.array(cidr).max(1000).nullable().default(null),
    allowBrowser: z.boolean().nullable().default(false).transform((v) => v ?? false),
    modelLimits: z.array(modelLimit).max(1000).nullable().default(null),
    period: budgetPeriod.default(null),
    /**
     * Checks evaluated but not enforced for this key (DESIGN section 12). A name this build
     * does not know is dropped rather than refused: a newer console may name more checks, and
     * such a check stays enforced instead of the key, or the whole snapshot, being refused.
     */
    shadow: z.array(z.string().max(64)).max(64).nullable().default([]).transform(knownShadowChecks),
  })
  .refine((k) => (k.kind === 'personal' ? k.user !== null : k.project !== null), {
    message: 'a personal key needs a user, a team key needs a project',
  });

/** The console's price for a model glob: `input`/`output` per `per` tokens, in the console's currency. */
export const priceRecord = z.object({
  type: z.literal('price'),
  model: modelGlob,
  input: amount.nonnegative(),
  output: amount.nonnegative(),
  per: amount.positive(),
});

/** Longest history tag a console may send, and a sidecar sends back (`&tag=` on /changes). */
export const MAX_TAG_CHARS = 64;

/**
 * The console history a version was read in (a v1 addition): a version number alone cannot
 * tell this history from one a restored console lost. Opaque to the sidecar, which keeps
 * it beside its version and hands it back when it asks for changes; absent or null: none.
 */
export const historyTag = z.string().min(1).max(MAX_TAG_CHARS).nullish();

/**
 * A version the sidecar can send back exactly as `after=<int>`: past 2^53 a number prints
 * as `1e+21` or loses digits, and the console refuses such a cursor (400) on every poll.
 */
const syncVersion = z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER);

export const metaRecord = z.object({ type: z.literal('meta'), version: syncVersion, tag: historyTag });

export const syncRecord = z.discriminatedUnion('type', [projectRecord, walletRecord, keyRecord, priceRecord]);

/**
 * Records as the protocol allows them to be written: v1 additions may be absent (an older
 * console, a test, a file) and mean their defaults. Every writer of the replica accepts these.
 */
export type ProjectRecord = z.input<typeof projectRecord>;
export type WalletRecord = z.input<typeof walletRecord>;
export type KeyRecord = z.input<typeof keyRecord>;
export type PriceRecord = z.input<typeof priceRecord>;
export type SyncRecord = z.input<typeof syncRecord>;
export type MetaRecord = z.output<typeof metaRecord>;
/** Records as read: every field present, defaults filled in. */
export type ParsedRecord = z.output<typeof syncRecord>;
export type ParsedKeyRecord = z.output<typeof keyRecord>;

export const deleteChange = z.discriminatedUnion('type', [
  z.object({
    op: z.literal('delete'),
    type: z.enum(['project', 'wallet', 'key']),
    /** key and project id, or the wallet's user */
    id,
  }),
  // Prices are named by their model glob, not an id.
  z.object({ op: z.literal('delete'), type: z.literal('price'), model: modelGlob }),
]);

/** An upsert is `{"op":"upsert", ...record}`; parsed by stripping `op` and validating the record. */
export type UpsertChange = { op: 'upsert' } & ParsedRecord;
export type DeleteChange = z.output<typeof deleteChange>;
export type Change = UpsertChange | DeleteChange;

export interface ChangeBatch {
  version: number;
  changes: Change[];
  /** the console history `version` belongs to; null or absent when the console sent none */
  tag?: string | null;
}

/** The identity of a record within a snapshot or the feed: `key:k_1`, `wallet:u_1`, `price:gpt-4o*`. */
export function recordIdentity(r: SyncRecord | DeleteChange): string {
  if (r.type === 'wallet') return `wallet:${'user' in r ? r.user : r.id}`;
  if (r.type === 'price') return `price:${r.model}`;
  return `${r.type}:${r.id}`;
}

export function issueText(error: z.ZodError): string {
  return error.issues.map((i) => (i.path.length ? `${i.path.join('.')}: ${i.message}` : i.message)).join('; ');
}

export type Parsed<T> = { ok: true; value: T } | { ok: false; error: string };

/** Parses one NDJSON snapshot line (already JSON-decoded). */
export function parseRecord(value: unknown): Parsed<ParsedRecord> {
  const r = syncRecord.safeParse(value);
  return r.success ? { ok: true, value: r.data } : { ok: false, error: issueText(r.error) };
}

export function parseMeta(value: unknown): Parsed<MetaRecord> {
  const r = metaRecord.safeParse(value);
  return r.success ? { ok: true, value: r.data } : { ok: false, error: issueText(r.error) };
}

export function parseChange(value: unknown): Parsed<Change> {
  if (typeof value !== 'object' || value === null) return { ok: false, error: 'change must be an object' };
  const { op, ...rest } = value as Record<string, unknown>;
  if (op === 'delete') {
    // A wallet is named by its `user` in its record; a console may name it so in a delete too.
    const named = rest.type === 'wallet' && rest.id === undefined && rest.user !== undefined ? { ...rest, op, id: rest.user } : value;
    const r = deleteChange.safeParse(named);
    return r.success ? { ok: true, value: r.data } : { ok: false, error: issueText(r.error) };
  }
  if (op !== 'upsert') return { ok: false, error: 'op must be "upsert" or "delete"' };
  const rec = parseRecord(rest);
  return rec.ok ? { ok: true, value: { op: 'upsert', ...rec.value } } : rec;
}

const RECORD_TYPES = new Set(['project', 'wallet', 'key', 'price']);

/**
 * A record, or a change, of a type this version does not know (one a newer console adds,
 * as v1 added `price`): skipped, as a field it does not know is ignored, so a console
 * upgraded first does not stop every sidecar's sync.
 */
export function isOtherRecordType(value: unknown): boolean {
  if (typeof value !== 'object' || value === null) return false;
  const type = (value as Record<string, unknown>).type;
  return typeof type === 'string' && type !== 'meta' && !RECORD_TYPES.has(type);
}

export function parseChangeBatch(value: unknown): Parsed<ChangeBatch> {
  if (typeof value !== 'object' || value === null) return { ok: false, error: 'batch must be an object' };
  const { version, changes, tag } = value as Record<string, unknown>;
  const v = syncVersion.safeParse(version);
  if (!v.success) return { ok: false, error: `version must be an integer from 0 to ${Number.MAX_SAFE_INTEGER}` };
  const t = historyTag.safeParse(tag);
  if (!t.success) return { ok: false, error: `tag must be a string of 1 to ${MAX_TAG_CHARS} characters` };
  if (!Array.isArray(changes)) return { ok: false, error: 'changes must be an array' };
  const out: Change[] = [];
  for (let i = 0; i < changes.length; i++) {
    if (isOtherRecordType(changes[i])) continue;
    const c = parseChange(changes[i]);
    if (!c.ok) return { ok: false, error: `changes[${i}]: ${c.error}` };
    out.push(c.value);
  }
  return { ok: true, value: { version: v.data, changes: out, tag: t.data ?? null } };
}

export const SNAPSHOT_PATH = '/sync/v1/snapshot';
export const CHANGES_PATH = '/sync/v1/changes';
export const USAGE_PATH = '/sync/v1/usage';

