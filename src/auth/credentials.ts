/**
 * Credential extraction (DESIGN section 4). Pure: takes the raw header list and the
 * route's credential rule, returns the key or a denial. Only Authorization: Bearer and
 * (on messages routes) x-api-key are credentials; cookies and query strings never are.
 */
import { deny, type Denial } from '../errors.js';

export type CredentialRule = 'bearer' | 'messages';

/**
 * A value of another header an upstream may read a key from, different from the key: an
 * upstream gateway that authenticates from it would act on a key never checked here, so a
 * value that is a key of the replica's is a conflict (the pipeline looks it up). Anything
 * else there (a provider key, say) is no credential and passes, as the seed says.
 */
export interface OtherKey {
  header: 'x-api-key' | OtherKeyHeader;
  value: string;
}

/**
 * Headers some upstream gateways read a key from: Azure's, Google's, LiteLLM's own, and
 * `x_api_key`, which CGI-style servers (WSGI) read as x-api-key.
 */
type OtherKeyHeader = 'api-key' | 'x-goog-api-key' | 'x-litellm-api-key' | 'x_api_key';

const NO_OTHERS: readonly OtherKey[] = Object.freeze([]);

export type Extracted = { ok: true; key: string; header: 'authorization' | 'x-api-key'; others: readonly OtherKey[] } | { ok: false; denial: Denial };

/** `Bearer <key>`, the scheme in any letter case: the key is the first group. */
export const BEARER = /^bearer[ \t]+(.*)$/i;

interface Found {
  authorization: string[];
  apiKey: string[];
  /** `x_api_key` lines: no credential, but CGI-style servers (WSGI) read them as x-api-key */
  underscored: number;
  /** lines of the OtherKeyHeader headers (null: none, the usual case) */
  others: OtherKey[] | null;
}

/** Collects every line of the two headers; Node's req.headers keeps only the first of each. */
function collect(rawHeaders: readonly string[]): Found {
  const found: Found = { authorization: [], apiKey: [], underscored: 0, others: null };
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!;
    // cheap length gate before the case-insensitive compare: this runs on every request
    if (name.length === 13 && name.toLowerCase() === 'authorization') found.authorization.push(rawHeaders[i + 1]!);
    else if (name.length === 9) {
      const lower = name.toLowerCase();
      if (lower === 'x-api-key') found.apiKey.push(rawHeaders[i + 1]!);
      else if (lower === 'x_api_key') {
        found.underscored++;
        (found.others ??= []).push({ header: 'x_api_key', value: rawHeaders[i + 1]! });
      }
    } else if ((name.length === 7 || name.length === 14 || name.length === 17) && startsAOrX(name)) {
      const header = otherKeyHeader(name.toLowerCase());
      if (header) (found.others ??= []).push({ header, value: rawHeaders[i + 1]! });
    }
  }
  return found;
}

/** `a` or `x` in either case: Content-Length and Transfer-Encoding share the lengths. */
const startsAOrX = (name: string): boolean => {
  const c = name.charCodeAt(0) | 0x20;
  return c === 0x61 || c === 0x78;
};

const otherKeyHeader = (lower: string): OtherKeyHeader | null =>
  lower === 'api-key' || lower === 'x-goog-api-key' || lower === 'x-litellm-api-key' ? lower : null;

/** The other headers' values that are not `key` (LiteLLM's may carry `Bearer `), in UTF-8 as the key is. */
function othersBeside(key: string, found: Found, apiKeyToo: boolean): readonly OtherKey[] {
  if (found.others === null && !(apiKeyToo && found.apiKey.length > 0)) return NO_OTHERS;
  const lines = [...(apiKeyToo ? found.apiKey.map((value) => ({ header: 'x-api-key' as const, value })) : []), ...(found.others ?? [])];
  const others: OtherKey[] = [];
  for (const { header, value } of lines) {
    const bearer = header === 'x-litellm-api-key' ? parseBearer(value) : null;
    const v = utf8Of(bearer?.kind === 'key' ? bearer.key : value.trim());
    if (v !== '' && v !== key) others.push({ header, value: v });
  }
  return others;
}

type Bearer = { kind: 'key'; key: string } | { kind: 'none' } | { kind: 'other-scheme' };

function parseBearer(value: string | undefined): Bearer {
  if (value === undefined) return { kind: 'none' };
  const v = value.trim();
  if (v === '') return { kind: 'none' };
  const m = BEARER.exec(v);
  if (!m) return /^bearer$/i.test(v) ? { kind: 'none' } : { kind: 'other-scheme' };
  const key = m[1]!.trim();
  return key === '' ? { kind: 'none' } : { kind: 'key', key };
}

type ConflictVariant = 'two_authorization' | 'two_x_api_key' | 'other_scheme' | 'underscored' | undefined;
type MissingVariant = 'messages' | 'not_bearer' | 'not_bearer_messages' | 'x_api_key_here' | undefined;
const conflict = (variant: ConflictVariant) => ({ ok: false as const, denial: deny('conflicting_api_keys', variant ? { variant } : {}) });
const missing = (variant: MissingVariant) => ({ ok: false as const, denial: deny('missing_api_key', variant ? { variant } : {}) });

/**
 * The key as the client's bytes spell it in UTF-8: Node reads header values as latin1, one
 * character a byte, so a key with characters outside ASCII arrives spelled otherwise.
 */
export function utf8Of(value: string): string {
  // eslint-disable-next-line no-control-regex
  return /[^\x00-\x7f]/.test(value) ? Buffer.from(value, 'latin1').toString('utf8') : value;
}

export function extractCredential(rawHeaders: readonly string[], rule: CredentialRule): Extracted {
  const found = collect(rawHeaders);
  const e = extractRaw(found, rule);
  if (e.ok) {
    e.key = utf8Of(e.key);
    // On messages routes x-api-key and Authorization were compared already.
    e.others = othersBeside(e.key, found, rule === 'bearer');
  }
  return e;
}

const chosen = (key: string, header: 'authorization' | 'x-api-key'): Extracted => ({ ok: true, key, header, others: NO_OTHERS });

function extractRaw(found: Found, rule: CredentialRule): Extracted {
  if (found.authorization.length > 1) {
    return conflict('two_authorization');
  }
  if (found.apiKey.length > 1) {
    return conflict('two_x_api_key');
  }
  const bearer = parseBearer(found.authorization[0]);
  if (rule === 'messages') {
    // A key read from one header while the upstream may read another from `x_api_key`.
    if (found.underscored > 0 && (found.apiKey.length > 0 || bearer.kind === 'key')) return conflict('underscored');
    const apiKey = found.apiKey[0]?.trim() ?? '';
    if (apiKey !== '') {
      if (bearer.kind === 'key' && bearer.key !== apiKey) {
        return conflict(undefined);
      }
      // An upstream that authenticates from Authorization would act on a credential never checked.
      if (bearer.kind === 'other-scheme') return conflict('other_scheme');
      return chosen(apiKey, 'x-api-key');
    }
    if (bearer.kind === 'key') return chosen(bearer.key, 'authorization');
    if (bearer.kind === 'other-scheme') {
      return missing('not_bearer_messages');
    }
    return missing('messages');
  }
  if (bearer.kind === 'key') return chosen(bearer.key, 'authorization');
  if (bearer.kind === 'other-scheme') return missing('not_bearer');
  if (found.apiKey.length > 0) {
    return missing('x_api_key_here');
  }
  return missing(undefined);
}

const PROVIDER_PREFIXES: readonly [string, string][] = [
  ['sk-ant-', 'an Anthropic API key'],
  ['sk-proj-', 'an OpenAI project key'],
  ['sk-svcacct-', 'an OpenAI service-account key'],
  ['sk-or-', 'an OpenRouter key'],
  ['AIza', 'a Google API key'],
  ['gsk_', 'a Groq key'],
  ['xai-', 'an xAI key'],
];

/** The 401 for a key that is not in the replica; names a provider when the key looks like one. */
export function unknownKeyDenial(key: string): Denial {
  for (const [prefix, what] of PROVIDER_PREFIXES) {
    if (key.startsWith(prefix)) return deny('invalid_api_key', { variant: 'provider', params: { what } });
  }
  if (/^sk-[A-Za-z0-9_-]{20,}$/.test(key)) return deny('invalid_api_key', { variant: 'provider', params: { what: 'an OpenAI API key' } });
  return deny('invalid_api_key');
}
