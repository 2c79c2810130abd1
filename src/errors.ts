/**
 * The error catalogue (DESIGN section 5): code -> status and types, and both body
 * styles with their headers. Pure. Messages never contain key material.
 */

export type ErrorStyle = 'openai' | 'messages';


/**
 * Every code's status and its messages. A code's `message` is what a client reads;
 * `variants` are the other situations the same code covers. `{name}` placeholders are
 * filled from `params` (already cleaned and bounded by the caller). Codes that describe
 * a problem with the input (`invalid_request`, `invalid_path`) may carry the parser's
 * own description of what is wrong instead.
 */
interface CatalogueEntry {
  status: number;
  message: string;
  variants?: Record<string, string>;
}

export const CATALOGUE = {
  not_found: { status: 404, message: 'No route here for {method} on this path.' },
  invalid_path: { status: 400, message: 'The request path is not accepted.' },
  missing_api_key: {
    status: 401,
    message: 'No API key was sent. Send it as Authorization: Bearer <key>.',
    variants: {
      messages: 'No API key was sent. Send it in the x-api-key header (or as Authorization: Bearer <key>).',
      not_bearer: 'The Authorization header must use the Bearer scheme: Authorization: Bearer <key>.',
      not_bearer_messages: 'The Authorization header must use the Bearer scheme; or send the key in the x-api-key header.',
      x_api_key_here: 'This route reads the key only from the Authorization header: send Authorization: Bearer <key> instead of x-api-key.',
    },
  },
  conflicting_api_keys: {
    status: 401,
    message: 'Both x-api-key and Authorization: Bearer were sent with different keys; send one key.',
    variants: {
      two_authorization: 'More than one Authorization header was sent; send exactly one.',
      two_x_api_key: 'More than one x-api-key header was sent; send exactly one.',
      other_scheme: 'Both x-api-key and an Authorization header of another scheme were sent; send the key in one of them (x-api-key, or Authorization: Bearer).',
      underscored: 'An x_api_key header was sent beside the key; some servers read it as x-api-key. Send the key in x-api-key alone.',
      other_header: 'Another API key was sent in the {header} header beside the key; send one key.',
    },
  },
  invalid_api_key: {
    status: 401,
    message: 'Invalid API key. Check the key, or create a new one in the console.',
    variants: {
      provider: 'Invalid API key: this looks like {what}. Provider keys are not accepted here; use an API key issued by this service.',
    },
  },
  api_key_deleted: { status: 401, message: 'This API key has been deleted. Create a new key in the console.' },
  ip_not_allowed: { status: 403, message: 'This API key may not be used from this network address.' },
  browser_request_refused: {
    status: 403,
    message: 'API keys must not be used from browser code. Call the API from a server, or ask for a key that allows browsers.',
  },
  project_disabled: { status: 402, message: 'The project this key belongs to is disabled.' },
  // `hold`: step 9, where what is left is not used up but is less than this request could cost.
  key_budget_exhausted: {
    status: 402,
    message: "This key's budget is used up. Ask a project admin to raise it.",
    variants: { hold: "This request could cost more than is left of this key's budget. Ask for fewer output tokens (max_tokens), or ask a project admin to raise the budget." },
  },
  project_budget_exhausted: {
    status: 402,
    message: "The project's budget is used up. Ask a project admin to raise it.",
    variants: { hold: "This request could cost more than is left of the project's budget. Ask for fewer output tokens (max_tokens), or ask a project admin to raise the budget." },
  },
  insufficient_balance: {
    status: 402,
    message: 'Your wallet balance is used up. Add credit to continue.',
    variants: { hold: 'This request could cost more than your wallet balance. Ask for fewer output tokens (max_tokens), or add credit.' },
  },
  invalid_request: {
    status: 400,
    message: 'The request could not be read.',
    variants: {
      http: 'The request could not be parsed as HTTP.',
      // answered with 408
      headers_timeout: 'The request headers did not arrive in time.',
      // answered with 431
      headers_too_large: 'The request line and headers are larger than {limit} bytes.',
      // answered with 417
      expectation: 'Only "Expect: 100-continue" is understood; send the request without another expectation.',
      two_host: 'More than one Host header was sent; send exactly one.',
      no_host: 'No Host header was sent; an HTTP/1.1 request carries exactly one.',
      bad_host: 'The Host header must be a host name or address, with an optional port.',
      transfer_coding: 'Only "Transfer-Encoding: chunked" is accepted as a request transfer coding.',
      cut_short: 'The request body was cut short.',
      stalled: 'The request body stalled: no byte arrived for {ms} ms.',
    },
  },
  body_too_large: { status: 413, message: 'The request body is larger than {limit} bytes.' },
  model_not_allowed: {
    status: 403,
    message: 'This key may not use the model "{model}".',
    variants: { unnamed: 'This key is limited to certain models; name the model in the request.' },
  },
  route_capacity_exceeded: { status: 429, message: 'The upstream this key is routed to is at capacity; retry after the indicated time.' },
  rpm_exceeded: { status: 429, message: "This key's requests-per-minute limit is reached; retry after the indicated time." },
  tpm_exceeded: { status: 429, message: "This key's tokens-per-minute limit is reached; retry after the indicated time." },
  concurrency_exceeded: { status: 429, message: 'This key has too many requests in flight; retry when one has finished.' },
  upstream_unavailable: { status: 502, message: 'The upstream gateway could not be reached.' },
  upstream_timeout: { status: 504, message: 'The upstream gateway did not answer in time.' },
  not_ready: { status: 503, message: 'The sidecar has not loaded its key replica yet; try again shortly.' },
  limits_unavailable: { status: 503, message: 'The limits store is unavailable and the sidecar is configured to fail closed; retry shortly.' },
  internal_error: { status: 500, message: 'The sidecar failed to handle the request.' },
} satisfies Record<string, CatalogueEntry>;

export type ErrorCode = keyof typeof CATALOGUE;

type VariantOf<C extends ErrorCode> = (typeof CATALOGUE)[C] extends { variants: infer V } ? keyof V & string : never;

/** Default status per code; project_disabled is 403 on files routes and 402 on model routes. */
export const STATUS = Object.fromEntries(Object.entries(CATALOGUE).map(([code, e]) => [code, e.status])) as Record<ErrorCode, number>;

export interface Denial {
  code: ErrorCode;
  message: string;
  /** overrides STATUS[code] (project_disabled on files routes) */
  status?: number;
  /** for 429 (and 503 where a wait makes sense) */
  retryAfterMs?: number;
}

/**
 * Each body style's error `type` by status. A status not listed is
 * `invalid_request_error`, and every 5xx is `api_error`.
 */
const ERROR_TYPES: Record<number, Record<ErrorStyle, string>> = {
  401: { openai: 'authentication_error', messages: 'authentication_error' },
  402: { openai: 'insufficient_quota', messages: 'billing_error' },
  403: { openai: 'permission_error', messages: 'permission_error' },
  404: { openai: 'invalid_request_error', messages: 'not_found_error' },
  413: { openai: 'invalid_request_error', messages: 'request_too_large' },
  429: { openai: 'rate_limit_error', messages: 'rate_limit_error' },
};

function errorType(status: number, style: ErrorStyle): string {
  if (status >= 500) return 'api_error';
  return ERROR_TYPES[status]?.[style] ?? 'invalid_request_error';
}

export interface ErrorResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * The header that marks an answer as keyward's own denial. An upstream's line of that name
 * is dropped from forwarded responses, so a client can tell the two apart.
 */
export const ERROR_HEADER = 'x-keyward-error';

/** The longest Retry-After the official SDKs wait out by themselves (under a minute). */
const SDK_LONGEST_WAIT_MS = 60_000;

/** Renders a denial in the route's style with the headers every denial carries. */
export function renderError(denial: Denial, style: ErrorStyle): ErrorResponse {
  const status = denial.status ?? STATUS[denial.code];
  const body =
    style === 'messages'
      ? { type: 'error', error: { type: errorType(status, style), message: denial.message } }
      : { error: { message: denial.message, type: errorType(status, style), code: denial.code } };
  const text = JSON.stringify(body);
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'content-length': String(Buffer.byteLength(text)),
    [ERROR_HEADER]: denial.code,
  };
  if (status === 401 || status === 402 || status === 403) headers['x-should-retry'] = 'false';
  if (status === 429 || (status === 503 && denial.retryAfterMs !== undefined)) {
    const wait = denial.retryAfterMs;
    const ms = Math.max(1, Math.ceil(wait !== undefined && Number.isFinite(wait) ? wait : 1000));
    headers['retry-after'] = String(Math.max(1, Math.ceil(ms / 1000)));
    headers['retry-after-ms'] = String(ms);
    // The openai SDK takes a wait of a minute or more for no wait and retries within a
    // second, twice, into the same refusal: told not to, it hands the 429 and its wait over.
    if (ms >= SDK_LONGEST_WAIT_MS) headers['x-should-retry'] = 'false';
  }
  return { status, headers, body: text };
}

export interface DenyOptions<C extends ErrorCode> {
  /** another situation the code covers (see the catalogue) */
  variant?: VariantOf<C>;
  /** values for the message's `{name}` placeholders */
  params?: Record<string, string | number>;
  /** invalid_request / invalid_path: the parser's own description of what is wrong */
  detail?: string;
  status?: number;
  retryAfterMs?: number;
}

function fill(template: string, params: Record<string, string | number> | undefined): string {
  return params ? template.replace(/\{(\w+)\}/g, (m, name: string) => (params[name] === undefined ? m : String(params[name]))) : template;
}

/** The one way a denial is made: the message comes from the catalogue. */
export function deny<C extends ErrorCode>(code: C, opts: DenyOptions<C> = {}): Denial {
  const entry: CatalogueEntry = CATALOGUE[code];
  const template = opts.variant !== undefined ? entry.variants![opts.variant]! : entry.message;
  const denial: Denial = { code, message: opts.detail ?? fill(template, opts.params) };
  if (opts.status !== undefined) denial.status = opts.status;
  if (opts.retryAfterMs !== undefined) denial.retryAfterMs = opts.retryAfterMs;
  return denial;
}
