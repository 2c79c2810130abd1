/**
 * Console sync protocol v1 (DESIGN section 7): record shapes, change batches and their
 * validators. Pure: no I/O. Shared by the sidecar (import, sync client, replica) and the
 * reference console.
 */
import { z } from 'zod';

const id = z.string().min(1).max(256);
const amount = z.number().finite();
const nullableCount = z.number().int().nonnegative().nullable();

export const projectRecord = z.strictObject({
  type: z.literal('project'),
  id,
  status: z.enum(['enabled', 'disabled']),
  budget: amount.nonnegative().nullable(),
  spent: amount,
});

export const walletRecord = z.strictObject({
  type: z.literal('wallet'),
  user: id,
  balance: amount,
});

export const keyRecord = z
  .strictObject({
    type: z.literal('key'),
    id,
    hash: z.string().regex(/^[0-9a-f]{64}$/, 'expected 64 lowercase hex characters'),
    kind: z.enum(['personal', 'team']),
    user: id.nullable(),
    project: id.nullable(),
    status: z.enum(['active', 'deleted']),
    budget: amount.nonnegative().nullable(),
    spent: amount,
    models: z.array(z.string().min(1).max(256)).nullable(),
    routing: z.string().min(1).max(64).nullable(),
    rpm: nullableCount,
    tpm: nullableCount,
    concurrency: nullableCount,
  })
  .refine((k) => (k.kind === 'personal' ? k.user !== null : k.project !== null), {
    message: 'a personal key needs a user, a team key needs a project',
  });

export const metaRecord = z.strictObject({ type: z.literal('meta'), version: z.number().int().nonnegative() });

export const syncRecord = z.discriminatedUnion('type', [projectRecord, walletRecord, keyRecord]);

export type ProjectRecord = z.infer<typeof projectRecord>;
export type WalletRecord = z.infer<typeof walletRecord>;
export type KeyRecord = z.infer<typeof keyRecord>;
export type SyncRecord = z.infer<typeof syncRecord>;
export type MetaRecord = z.infer<typeof metaRecord>;

export const deleteChange = z.strictObject({
  op: z.literal('delete'),
  type: z.enum(['project', 'wallet', 'key']),
  /** key and project id, or the wallet's user */
  id,
});

/** An upsert is `{"op":"upsert", ...record}`; parsed by stripping `op` and validating the record. */
export type UpsertChange = { op: 'upsert' } & SyncRecord;
export type DeleteChange = z.infer<typeof deleteChange>;
export type Change = UpsertChange | DeleteChange;

export interface ChangeBatch {
  version: number;
  changes: Change[];
}

export function issueText(error: z.ZodError): string {
  return error.issues.map((i) => (i.path.length ? `${i.path.join('.')}: ${i.message}` : i.message)).join('; ');
}

export type Parsed<T> = { ok: true; value: T } | { ok: false; error: string };

/** Parses one NDJSON snapshot line (already JSON-decoded). */
export function parseRecord(value: unknown): Parsed<SyncRecord> {
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
    const r = deleteChange.safeParse(value);
    return r.success ? { ok: true, value: r.data } : { ok: false, error: issueText(r.error) };
  }
  if (op !== 'upsert') return { ok: false, error: 'op must be "upsert" or "delete"' };
  const rec = parseRecord(rest);
  return rec.ok ? { ok: true, value: { op: 'upsert', ...rec.value } } : rec;
}

export function parseChangeBatch(value: unknown): Parsed<ChangeBatch> {
  if (typeof value !== 'object' || value === null) return { ok: false, error: 'batch must be an object' };
  const { version, changes } = value as Record<string, unknown>;
  if (typeof version !== 'number' || !Number.isInteger(version) || version < 0) {
    return { ok: false, error: 'version must be a non-negative integer' };
  }
  if (!Array.isArray(changes)) return { ok: false, error: 'changes must be an array' };
  const out: Change[] = [];
  for (let i = 0; i < changes.length; i++) {
    const c = parseChange(changes[i]);
    if (!c.ok) return { ok: false, error: `changes[${i}]: ${c.error}` };
    out.push(c.value);
  }
  return { ok: true, value: { version, changes: out } };
}

export const SNAPSHOT_PATH = '/sync/v1/snapshot';
export const CHANGES_PATH = '/sync/v1/changes';
export const USAGE_PATH = '/sync/v1/usage';

