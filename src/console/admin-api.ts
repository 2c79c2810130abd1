/**
 * The admin API under /admin/v1. An admin token may do everything. A user token may list,
 * show and reveal only its own personal keys and the keys of projects it belongs to, and
 * read its own wallet and its projects; anything else is 403, a missing token 401.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { z } from 'zod';
import { budgetPeriod, cidr } from '../protocol/records.js';
import { SHADOW_CHECKS } from '../protocol/shadow-checks.js';
import { resetSpent } from './budgets.js';
import { idPattern, KEY_SHAPED_MESSAGE, modelGlob, notKeyShaped } from './config.js';
import { ApiError, MethodNotAllowed, invalid } from './errors.js';
import { forbidden, intParam, match, principalName, readJson, sendJson, type Principal } from './http.js';
import { KEY_PAGE_MAX, listKeys } from './key-list.js';
import type { LogSink } from '../log.js';
import type { WalletView } from './db.js';
import type { ConsoleStore } from './store.js';
import { recentUsage } from './usage.js';

const ident = z.string().regex(idPattern, 'expected an id of letters, digits, and . _ @ -').refine(notKeyShaped, KEY_SHAPED_MESSAGE);
const count = z.number().int().nonnegative().nullable().optional();
/**
 * Amounts stay far inside what the store's rounding (`money`) and the sync feed's JSON can
 * carry: 1e300 would round to Infinity and go out as null, which every sidecar refuses.
 */
const MAX_AMOUNT = 1e12;
const amount = () => z.number().finite().min(-MAX_AMOUNT).max(MAX_AMOUNT);
const budget = amount().nonnegative().nullable().optional();
/** Text people read (a key's name, its routing tag): no control characters, which terminals act on. */
const plainText = (max: number) =>
  z.string().max(max).regex(/^[^\x00-\x1f\x7f-\x9f]*$/, 'expected text without control characters').refine(notKeyShaped, KEY_SHAPED_MESSAGE); // eslint-disable-line no-control-regex
const settings = {
  name: plainText(200).nullable().optional(),
  models: z.array(modelGlob).max(1000).nullable().optional(),
  routing: plainText(64).min(1).nullable().optional(),
  rpm: count,
  tpm: count,
  concurrency: count,
  budget,
  /** client addresses the key works from (DESIGN section 4); null: anywhere */
  ips: z.array(cidr).min(1).max(1000).nullable().optional(),
  allowBrowser: z.boolean().optional(),
  /** per-model limits in addition to the key's own; the first matching entry applies */
  modelLimits: z
    .array(z.strictObject({ models: modelGlob, rpm: count.transform((v) => v ?? null), tpm: count.transform((v) => v ?? null) }))
    .min(1).max(1000).nullable().optional(),
  period: budgetPeriod.optional(),
  /** checks evaluated but not enforced for this key (DESIGN section 12); [] for none */
  shadow: z.array(z.enum(SHADOW_CHECKS)).max(SHADOW_CHECKS.length).optional(),
};
const createKeyBody = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('personal'), user: ident, ...settings }),
  z.strictObject({ kind: z.literal('team'), project: ident, ...settings }),
]);
const updateKeyBody = z.strictObject(settings);
const createProjectBody = z.strictObject({
  id: ident,
  budget,
  members: z.array(ident).max(10_000).optional(),
  period: budgetPeriod.optional(),
});
const updateProjectBody = z.strictObject({
  status: z.enum(['enabled', 'disabled']).optional(),
  budget,
  period: budgetPeriod.optional(),
});
const creditBody = z.strictObject({ amount: amount().positive() });
const setBody = z.strictObject({ balance: amount() });

interface Ctx {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  who: Principal & { role: 'admin' | 'user' };
  store: ConsoleStore;
  log: LogSink;
}

type Handler = (ctx: Ctx) => Promise<void> | void;
interface Route { method: string; pattern: string; adminOnly: boolean; handle: Handler }

const asUser = (ctx: Ctx) => (ctx.who.role === 'user' ? ctx.who.user : null);

/** 404 for a key that does not exist, 403 for one the user token may not see. */
function visibleKey(ctx: Ctx) {
  const row = ctx.store.keyRow(ctx.params.id!);
  const user = asUser(ctx);
  if (user !== null && !ctx.store.canSee(user, row)) throw forbidden('this key belongs to someone else');
  return row;
}

/** `by` names the user, or which admin token (`admin#2`); `remote_addr` where the call came from. */
function audit(ctx: Ctx, action: string, fields: Record<string, unknown>) {
  ctx.log.info({ audit: action, by: principalName(ctx.who), remote_addr: ctx.req.socket.remoteAddress ?? null, ...fields }, `admin ${action}`);
}

/** The `:user` of the path, when it is an id a user may have. */
function userParam(ctx: Ctx): string {
  const user = ctx.params.user!;
  if (!idPattern.test(user)) throw invalid('user: expected an id of letters, digits, and . _ @ -');
  // A wallet's user id goes to every replica, as any other id does.
  if (!notKeyShaped(user)) throw invalid(`user: ${KEY_SHAPED_MESSAGE}`);
  return user;
}

/** Audits a change to a wallet (credit or new balance) and answers with the wallet. */
function walletChanged(ctx: Ctx, action: 'wallet.credit' | 'wallet.set', wallet: WalletView, fields: Record<string, number>): void {
  audit(ctx, action, { user: wallet.user, ...fields });
  sendJson(ctx.res, 200, { wallet });
}

const routes: Route[] = [
  { method: 'GET', pattern: '/admin/v1/whoami', adminOnly: false, handle: (c) => sendJson(c.res, 200, c.who) },
  {
    method: 'GET', pattern: '/admin/v1/keys', adminOnly: false,
    handle: (c) => {
      const user = asUser(c);
      const filter = {
        ...(c.query.has('user') ? { user: c.query.get('user')! } : {}),
        ...(c.query.has('project') ? { project: c.query.get('project')! } : {}),
        includeDeleted: c.query.get('all') === '1' || c.query.get('all') === 'true',
        ...(user !== null ? { visibleTo: { user } } : {}),
        ...(c.query.has('after') ? { after: c.query.get('after')! } : {}),
        limit: intParam(c.query, 'limit', { min: 1, max: KEY_PAGE_MAX, def: KEY_PAGE_MAX }),
      };
      sendJson(c.res, 200, listKeys(c.store.db, filter));
    },
  },
  {
    method: 'POST', pattern: '/admin/v1/keys', adminOnly: true,
    handle: async (c) => {
      const body = await readJson(c.req, createKeyBody);
      const out = c.store.createKey(body);
      audit(c, 'key.create', { key_id: out.key.id, kind: out.key.kind });
      sendJson(c.res, 201, out);
    },
  },
  { method: 'GET', pattern: '/admin/v1/keys/:id', adminOnly: false, handle: (c) => sendJson(c.res, 200, { key: c.store.getKey(visibleKey(c).id) }) },
  {
    method: 'PATCH', pattern: '/admin/v1/keys/:id', adminOnly: true,
    handle: async (c) => {
      const body = await readJson(c.req, updateKeyBody);
      const key = c.store.updateKey(c.params.id!, body);
      audit(c, 'key.update', { key_id: key.id, fields: Object.keys(body) });
      sendJson(c.res, 200, { key });
    },
  },
  {
    method: 'DELETE', pattern: '/admin/v1/keys/:id', adminOnly: true,
    handle: (c) => {
      const key = c.store.deleteKey(c.params.id!);
      audit(c, 'key.delete', { key_id: key.id });
      sendJson(c.res, 200, { key });
    },
  },
  {
    method: 'POST', pattern: '/admin/v1/keys/:id/reveal', adminOnly: false,
    handle: (c) => {
      const row = visibleKey(c);
      const secret = c.store.reveal(row.id);
      audit(c, 'key.reveal', { key_id: row.id });
      sendJson(c.res, 200, { id: row.id, secret });
    },
  },
  {
    // The key's latest usage events (newest first), for whoever may see the key.
    method: 'GET', pattern: '/admin/v1/keys/:id/usage', adminOnly: false,
    handle: (c) => {
      const limit = intParam(c.query, 'limit', { min: 1, max: 500, def: 20 });
      sendJson(c.res, 200, { usage: recentUsage({ store: c.store, keyId: visibleKey(c).id, limit }) });
    },
  },
  {
    method: 'POST', pattern: '/admin/v1/keys/:id/rotate', adminOnly: true,
    handle: (c) => {
      const out = c.store.rotateKey(c.params.id!);
      audit(c, 'key.rotate', { key_id: out.key.id, replaces: out.replaces.id });
      sendJson(c.res, 201, out);
    },
  },
  ...(['keys', 'projects'] as const).map((what): Route => ({
    method: 'POST', pattern: `/admin/v1/${what}/:id/reset`, adminOnly: true,
    handle: (c) => {
      // spent back to 0 and a new epoch: sidecars restart their live ledger from zero
      const out = resetSpent(c.store, { type: what === 'keys' ? 'key' : 'project', id: c.params.id! });
      audit(c, `${what === 'keys' ? 'key' : 'project'}.reset`, { [what === 'keys' ? 'key_id' : 'project_id']: c.params.id });
      sendJson(c.res, 200, out);
    },
  })),
  {
    method: 'GET', pattern: '/admin/v1/projects', adminOnly: false,
    handle: (c) => {
      const user = asUser(c);
      sendJson(c.res, 200, { projects: c.store.listProjects(user !== null ? { member: user } : {}) });
    },
  },
  {
    method: 'POST', pattern: '/admin/v1/projects', adminOnly: true,
    handle: async (c) => {
      const project = c.store.createProject(await readJson(c.req, createProjectBody));
      audit(c, 'project.create', { project_id: project.id });
      sendJson(c.res, 201, { project });
    },
  },
  {
    method: 'GET', pattern: '/admin/v1/projects/:id', adminOnly: false,
    handle: (c) => {
      const user = asUser(c);
      // Membership first: a user's 404 would tell which projects exist.
      if (user !== null && !c.store.isMember(c.params.id!, user)) throw forbidden('not a member of this project');
      sendJson(c.res, 200, { project: c.store.getProject(c.params.id!) });
    },
  },
  {
    method: 'PATCH', pattern: '/admin/v1/projects/:id', adminOnly: true,
    handle: async (c) => {
      const body = await readJson(c.req, updateProjectBody);
      const project = c.store.updateProject(c.params.id!, body);
      audit(c, 'project.update', { project_id: project.id, fields: Object.keys(body) });
      sendJson(c.res, 200, { project });
    },
  },
  ...(['PUT', 'DELETE'] as const).map((method): Route => ({
    method, pattern: '/admin/v1/projects/:id/members/:user', adminOnly: true,
    handle: (c) => {
      const user = userParam(c);
      const project = c.store.setMember({ project: c.params.id!, user, member: method === 'PUT' });
      audit(c, method === 'PUT' ? 'project.member.add' : 'project.member.remove', { project_id: project.id, user });
      sendJson(c.res, 200, { project });
    },
  })),
  { method: 'GET', pattern: '/admin/v1/wallets', adminOnly: true, handle: (c) => sendJson(c.res, 200, { wallets: c.store.listWallets() }) },
  {
    method: 'GET', pattern: '/admin/v1/wallets/:user', adminOnly: false,
    handle: (c) => {
      const user = asUser(c);
      if (user !== null && user !== c.params.user) throw forbidden('this wallet belongs to someone else');
      sendJson(c.res, 200, { wallet: c.store.getWallet(c.params.user!) });
    },
  },
  {
    method: 'POST', pattern: '/admin/v1/wallets/:user/credit', adminOnly: true,
    handle: async (c) => {
      const user = userParam(c);
      const { amount } = await readJson(c.req, creditBody);
      walletChanged(c, 'wallet.credit', c.store.changeWallet({ user, credit: amount }), { amount });
    },
  },
  {
    method: 'PUT', pattern: '/admin/v1/wallets/:user', adminOnly: true,
    handle: async (c) => {
      const user = userParam(c);
      const { balance } = await readJson(c.req, setBody);
      walletChanged(c, 'wallet.set', c.store.changeWallet({ user, set: balance }), { balance });
    },
  },
];

/** Handles an /admin/v1 request for an authenticated principal (the caller answered 401 already). */
export async function handleAdmin(opts: Omit<Ctx, 'params'> & { path: string }): Promise<void> {
  const allow: string[] = [];
  for (const r of routes) {
    const params = match(r.pattern, opts.path);
    if (!params) continue;
    if (r.method !== opts.req.method) {
      allow.push(r.method);
      continue;
    }
    if (r.adminOnly && opts.who.role !== 'admin') throw forbidden('this needs an admin token');
    return r.handle({ ...opts, params });
  }
  throw allow.length > 0 ? new MethodNotAllowed(allow) : new ApiError(404, 'not_found', 'no such endpoint');
}
