/**
 * Credential extraction (DESIGN section 4). Pure: takes the raw header list and the
 * route's credential rule, returns the key or a denial. Only Authorization: Bearer and
 * (on messages routes) x-api-key are credentials; cookies and query strings never are.
 */
import { deny, type Denial } from '../errors.js';

export type CredentialRule = 'bearer' | 'messages';

export type Extracted = { ok: true; key: string; header: 'authorization' | 'x-api-key' } | { ok: false; denial: Denial };

/** `Bearer <key>`, the scheme in any letter case: the key is the first group. */
export const BEARER = /^bearer[ \t]+(.*)$/i;

interface Found {
  authorization: string[];
  apiKey: string[];
  /** `x_api_key` lines: no credential, but CGI-style servers (WSGI) read them as x-api-key */
  underscored: number;
}

/** Collects every line of the two headers; Node's req.headers keeps only the first of each. */
function collect(rawHeaders: readonly string[]): Found {
  const found: Found = { authorization: [], apiKey: [], underscored: 0 };
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!;
    // cheap length gate before the case-insensitive compare: this runs on every request
    if (name.length === 13 && name.toLowerCase() === 'authorization') found.authorization.push(rawHeaders[i + 1]!);
    else if (name.length === 9) {
      const lower = name.toLowerCase();
      if (lower === 'x-api-key') found.apiKey.push(rawHeaders[i + 1]!);
      else if (lower === 'x_api_key') found.underscored++;
    }
  }
  return found;
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
function utf8Key(e: Extracted): Extracted {
  // eslint-disable-next-line no-control-regex
  if (!e.ok || !/[^\x00-\x7f]/.test(e.key)) return e;
  return { ok: true, key: Buffer.from(e.key, 'latin1').toString('utf8'), header: e.header };
}

export function extractCredential(rawHeaders: readonly string[], rule: CredentialRule): Extracted {
  return utf8Key(extractRaw(rawHeaders, rule));
}

function extractRaw(rawHeaders: readonly string[], rule: CredentialRule): Extracted {
  const found = collect(rawHeaders);
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
      return { ok: true, key: apiKey, header: 'x-api-key' };
    }
    if (bearer.kind === 'key') return { ok: true, key: bearer.key, header: 'authorization' };
    if (bearer.kind === 'other-scheme') {
      return missing('not_bearer_messages');
    }
    return missing('messages');
  }
  if (bearer.kind === 'key') return { ok: true, key: bearer.key, header: 'authorization' };
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
