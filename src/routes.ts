/**
 * Route table and path checks (DESIGN section 3). Pure. The path that is classified is
 * the path that is forwarded, so suspicious paths are rejected, never normalised.
 */
import type { ErrorStyle } from './errors.js';

/** self: answered by keyward itself (GET /v1/key), never forwarded */
export type RouteClass = 'listing' | 'model' | 'files' | 'self';

export interface Route {
  /** stable name for logs and metrics, e.g. "chat.completions" */
  name: string;
  class: RouteClass;
  /** bearer: only Authorization: Bearer; messages: x-api-key preferred, Bearer accepted */
  credentials: 'bearer' | 'messages';
  style: ErrorStyle;
  /** count_tokens: admitted like a model request but never charged tokens */
  countTokens: boolean;
  /** a request without `model`, bodiless included, is a 400 (APIs where model is optional upstream leave it out) */
  modelRequired: boolean;
  /** a call on a stored response: without a body it selects no model, and scope does not apply (DESIGN section 5, step 6) */
  storedCall: boolean;
}

export interface RouteRule {
  /** exact path, or prefix match when `prefix` is set (the bare prefix matches too) */
  path: string;
  prefix: boolean;
  methods: readonly string[] | null;
  /** when set, the whole path must match it (instead of `path`/`prefix`) */
  pattern?: RegExp;
  /** paths this rule never takes, whatever its path or pattern says */
  except?: readonly string[];
  route: Route;
}

export type Classified = { ok: true; route: Route; path: string } | { ok: false; code: 'not_found' | 'invalid_path'; message: string };

const r = (name: string, cls: RouteClass, extra: Partial<Route> = {}): Route => ({
  name,
  class: cls,
  credentials: 'bearer',
  style: 'openai',
  countTokens: false,
  modelRequired: false,
  storedCall: false,
  ...extra,
});

const rule = (path: string, route: Route, opts: { prefix?: boolean; methods?: string[]; pattern?: RegExp } = {}): RouteRule => ({
  path,
  prefix: opts.prefix ?? false,
  methods: opts.methods ?? null,
  ...(opts.pattern ? { pattern: opts.pattern } : {}),
  route,
});

const FILES = r('files', 'files');
const UPLOADS = r('uploads', 'files');

/** keyward's own answer, on every method: never forwarded, whatever an operator route covers. */
const SELF_PATH = '/v1/key';

export const DEFAULT_RULES: readonly RouteRule[] = [
  rule(SELF_PATH, r('key', 'self'), { methods: ['GET'] }),
  rule('/v1/models', r('models', 'listing'), { methods: ['GET'] }),
  rule('/v1/models', r('models', 'listing'), { prefix: true, methods: ['GET'] }),
  rule('/v1/chat/completions', r('chat.completions', 'model', { modelRequired: true })),
  rule('/v1/completions', r('completions', 'model', { modelRequired: true })),
  rule('/v1/embeddings', r('embeddings', 'model', { modelRequired: true })),
  rule('/v1/responses', r('responses', 'model', { modelRequired: true }), { methods: ['POST'] }),
  // OpenAI's token count for a Responses request, as count_tokens is Anthropic's: it generates nothing.
  rule('/v1/responses/input_tokens', r('responses.input_tokens', 'model', { countTokens: true }), { methods: ['POST'] }),
  rule('/v1/responses/{id}', r('responses', 'model', { storedCall: true }), { pattern: /^\/v1\/responses\/[^/]/ }),
  rule('/v1/responses', r('responses', 'model')),
  rule('/v1/moderations', r('moderations', 'model')),
  // Below the prefix only: the bare paths are no API (DESIGN section 3 lists /v1/images/*).
  rule('/v1/images/*', r('images', 'model'), { pattern: /^\/v1\/images\/./ }),
  rule('/v1/audio/*', r('audio', 'model'), { pattern: /^\/v1\/audio\/./ }),
  rule('/v1/messages/count_tokens', r('messages.count_tokens', 'model', { credentials: 'messages', style: 'messages', countTokens: true, modelRequired: true }), { methods: ['POST'] }),
  rule('/v1/messages', r('messages', 'model', { credentials: 'messages', style: 'messages', modelRequired: true }), { methods: ['POST'] }),
  // Files routes take only the methods the files and uploads APIs define: anything else is
  // 404 like any path outside the table (a body on an unexpected method is not forwarded).
  rule('/v1/files', FILES, { methods: ['GET', 'POST'] }),
  rule('/v1/files/{id}', FILES, { methods: ['GET', 'DELETE'], pattern: /^\/v1\/files\/[^/]+$/ }),
  rule('/v1/files/{id}/content', FILES, { methods: ['GET'], pattern: /^\/v1\/files\/[^/]+\/content$/ }),
  rule('/v1/uploads', UPLOADS, { methods: ['POST'] }),
  rule('/v1/uploads/{id}/{action}', UPLOADS, { methods: ['POST'], pattern: /^\/v1\/uploads\/[^/]+\/(?:parts|complete|cancel)$/ }),
];

/**
 * Turns config route entries into rules placed after the defaults: operator routes extend
 * the table (DESIGN section 3) and never replace a built-in route, whose checks (scope,
 * budgets, token limits) a wider class would skip. `/v1/key` stays keyward's on every
 * method (GET answered, the rest 404), never forwarded.
 */
export function buildRules(extra: readonly { path: string; methods?: string[] | undefined; class: RouteClass; credentials: 'bearer' | 'messages'; style: ErrorStyle; countTokens: boolean; modelRequired: boolean }[]): RouteRule[] {
  const custom = extra.map((e) => {
    const prefix = e.path.endsWith('/*');
    const path = prefix ? e.path.slice(0, -2) : e.path;
    return {
      ...rule(path, r(`custom:${path === '' ? '/*' : path}`, e.class, { credentials: e.credentials, style: e.style, countTokens: e.countTokens, modelRequired: e.modelRequired }), {
        prefix,
        ...(e.methods ? { methods: e.methods } : {}),
      }),
      except: [SELF_PATH],
    };
  });
  return [...DEFAULT_RULES, ...custom];
}

/** The built-in route that answers `method` on `path`, or null: an operator route there would never be reached. */
export function builtInRoute(method: string, path: string): string | null {
  const c = classify(DEFAULT_RULES, method, path);
  if (c.ok) return c.route.name;
  return path === SELF_PATH ? 'key' : null;
}

/** Unreserved characters (RFC 3986 section 2.3): a normaliser upstream decodes them, so they are never sent encoded. */
const UNRESERVED = /[A-Za-z0-9\-._~]/;

/**
 * Why a percent-encoded byte may not stand in the path, or null. Refused: what decodes to
 * a dot, slash, backslash or NUL (the path's structure), to an unreserved character (an
 * upstream that normalises reads another path), to a `%` (a second escape for an upstream
 * that decodes twice), or to a byte outside ASCII (Unicode look-alikes such as a fullwidth
 * dot or slash fold into the real ones upstream); and a `%` that does not start a valid
 * escape, which upstreams read each their own way.
 */
function encodingProblem(path: string): string | null {
  for (let i = path.indexOf('%'); i !== -1; i = path.indexOf('%', i + 1)) {
    const hex = path.slice(i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return 'a "%" in the path must start a two-digit hex escape';
    const byte = Number.parseInt(hex, 16);
    const char = String.fromCharCode(byte);
    if (char === '.' || char === '/' || char === '\\' || byte === 0) return 'encoded dots, slashes or backslashes are not allowed in the path';
    // `%252e` is `%2e` to an upstream that decodes once more: a dot keyward never saw.
    if (char === '%') return 'an encoded percent sign (%25) is not allowed in the path: an upstream that decodes twice would read another path';
    if (byte >= 0x80) return 'characters outside ASCII are not allowed in the path, raw or percent-encoded';
    if (UNRESERVED.test(char)) return `"%${hex}" encodes "${char}", which is sent as itself; encoded letters, digits and -._~ are not allowed in the path`;
  }
  return null;
}

/** Checks the raw request target; returns the path (no query) or why it is refused. */
export function checkPath(target: string): { ok: true; path: string } | { ok: false; message: string } {
  if (!target.startsWith('/')) {
    return { ok: false, message: 'absolute-form or malformed request targets are not accepted; send the path only' };
  }
  const q = target.indexOf('?');
  const path = q === -1 ? target : target.slice(0, q);
  if (path.startsWith('//')) return { ok: false, message: 'the path must not start with //' };
  // Upstreams that merge slashes, or drop a trailing one, would read another path.
  if (path.includes('//') || (path.length > 1 && path.endsWith('/'))) return { ok: false, message: 'empty path segments (// or a trailing /) are not allowed in the path' };
  if (path.includes('\\')) return { ok: false, message: 'backslashes are not allowed in the path' };
  // Servlet containers strip `;params` from each segment, so `..;` is `..` to them.
  if (path.includes(';')) return { ok: false, message: 'semicolons (path parameters) are not allowed in the path: some upstreams drop them and read another path' };
  const encoding = encodingProblem(path);
  if (encoding) return { ok: false, message: encoding };
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x20\x7f]/.test(path)) return { ok: false, message: 'control characters and spaces are not allowed in the path' };
  // eslint-disable-next-line no-control-regex
  if (/[^\x00-\x7f]/.test(path)) return { ok: false, message: 'characters outside ASCII are not allowed in the path, raw or percent-encoded' };
  for (const seg of path.split('/')) {
    if (seg === '.' || seg === '..') return { ok: false, message: 'dot segments are not allowed in the path' };
  }
  return urlRewrites(target) ? { ok: false, message: URL_REWRITE } : { ok: true, path };
}

const URL_REWRITE =
  'the request target holds characters that URL parsers cut or re-encode (#, quotes, <>, {}, ^, `, |, or an apostrophe in the query): percent-encode them';

/** Characters RFC 3986 allows nowhere in a request target; parsers differ on which they re-encode. */
const NOT_URL_CHARACTERS = /["<>\\^`{|}]/;

/**
 * Whether a WHATWG URL parser, which builds the forwarded path (http-proxy-3), would send
 * `target` otherwise than received: a `#` cuts the rest off, and a query's `'` is
 * re-encoded, so the upstream would read another path than the one classified. Characters
 * that are no URL characters at all are refused on every Node line alike, whichever of
 * them its parser happens to re-encode (Node 22's keeps `^`, Node 24's encodes it).
 */
function urlRewrites(target: string): boolean {
  if (NOT_URL_CHARACTERS.test(target)) return true;
  try {
    const u = new URL(target, 'http://keyward.invalid');
    // An empty query (`/v1/models?`) goes without its `?`: the same path and no query.
    return u.pathname + u.search !== (target.endsWith('?') && target.indexOf('?') === target.length - 1 ? target.slice(0, -1) : target);
  } catch {
    return true;
  }
}

function matches(rule: RouteRule, method: string, path: string): boolean {
  if (rule.methods && !rule.methods.includes(method)) return false;
  if (rule.except?.includes(path)) return false;
  if (rule.pattern) return rule.pattern.test(path);
  if (path === rule.path) return true;
  return rule.prefix && path.startsWith(rule.path) && path.charCodeAt(rule.path.length) === 47; // '/'
}

/**
 * Classifications already made, per rule table, method and request target. A sidecar sees
 * the same few targets again and again, and checking and matching one takes regular
 * expressions and string splits on every request, where a lookup takes one map read.
 * Bounded: a table that fills (clients sending endless distinct paths) is emptied and
 * starts over. Results are shared, so they are frozen.
 */
const MEMO_ENTRIES = 1024;
interface Memo {
  byMethod: Map<string, Map<string, Classified>>;
  size: number;
}
const memos = new WeakMap<readonly RouteRule[], Memo>();

/** Classifies a request: the first matching rule wins; no match is 404 and is not forwarded. */
export function classify(rules: readonly RouteRule[], method: string, target: string): Classified {
  let memo = memos.get(rules);
  if (memo === undefined) memos.set(rules, (memo = { byMethod: new Map(), size: 0 }));
  let byTarget = memo.byMethod.get(method);
  const hit = byTarget?.get(target);
  if (hit !== undefined) return hit;
  const result = Object.freeze(classifyOnce(rules, method, target));
  if (memo.size >= MEMO_ENTRIES) {
    memo.byMethod.clear();
    memo.size = 0;
    byTarget = undefined;
  }
  if (byTarget === undefined) memo.byMethod.set(method, (byTarget = new Map()));
  byTarget.set(target, result);
  memo.size++;
  return result;
}

function classifyOnce(rules: readonly RouteRule[], method: string, target: string): Classified {
  const checked = checkPath(target);
  if (!checked.ok) return { ok: false, code: 'invalid_path', message: checked.message };
  for (const rl of rules) {
    if (matches(rl, method, checked.path)) return { ok: true, route: rl.route, path: checked.path };
  }
  return { ok: false, code: 'not_found', message: `no route here for ${method} on this path` };
}
