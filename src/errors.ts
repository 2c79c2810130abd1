/**
 * The error catalogue (DESIGN section 5): code -> status and types, and both body
 * styles with their headers. Pure. Messages never contain key material.
 */

export type ErrorStyle = 'openai' | 'messages';

export type ErrorCode =
  | 'not_found'
  | 'invalid_path'
  | 'missing_api_key'
  | 'conflicting_api_keys'
  | 'invalid_api_key'
  | 'api_key_deleted'
  | 'project_disabled'
  | 'key_budget_exhausted'
  | 'project_budget_exhausted'
  | 'insufficient_balance'
  | 'invalid_request'
  | 'body_too_large'
  | 'model_not_allowed'
  | 'route_capacity_exceeded'
  | 'rpm_exceeded'
  | 'tpm_exceeded'
  | 'concurrency_exceeded'
  | 'upstream_unavailable'
  | 'upstream_timeout'
  | 'not_ready'
  | 'limits_unavailable'
  | 'internal_error';

/** Default status per code; project_disabled is 403 on files routes and 402 on model routes. */
export const STATUS: Record<ErrorCode, number> = {
  not_found: 404,
  invalid_path: 400,
  missing_api_key: 401,
  conflicting_api_keys: 401,
  invalid_api_key: 401,
  api_key_deleted: 401,
  project_disabled: 402,
  key_budget_exhausted: 402,
  project_budget_exhausted: 402,
  insufficient_balance: 402,
  invalid_request: 400,
  body_too_large: 413,
  model_not_allowed: 403,
  route_capacity_exceeded: 429,
  rpm_exceeded: 429,
  tpm_exceeded: 429,
  concurrency_exceeded: 429,
  upstream_unavailable: 502,
  upstream_timeout: 504,
  not_ready: 503,
  limits_unavailable: 503,
  internal_error: 500,
};

export interface Denial {
  code: ErrorCode;
  message: string;
  /** overrides STATUS[code] (project_disabled on files routes) */
  status?: number;
  /** for 429 (and 503 where a wait makes sense) */
  retryAfterMs?: number;
}

function openaiType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 402) return 'insufficient_quota';
  if (status === 403) return 'permission_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'api_error';
  return 'invalid_request_error';
}

function messagesType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 402) return 'billing_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 413) return 'request_too_large';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'api_error';
  return 'invalid_request_error';
}

export interface ErrorResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Renders a denial in the route's style with the headers every denial carries. */
export function renderError(denial: Denial, style: ErrorStyle): ErrorResponse {
  const status = denial.status ?? STATUS[denial.code];
  const body =
    style === 'messages'
      ? { type: 'error', error: { type: messagesType(status), message: denial.message } }
      : { error: { message: denial.message, type: openaiType(status), code: denial.code } };
  const text = JSON.stringify(body);
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'content-length': String(Buffer.byteLength(text)),
    'x-keyward-error': denial.code,
  };
  if (status === 401 || status === 402 || status === 403) headers['x-should-retry'] = 'false';
  if (status === 429 || (status === 503 && denial.retryAfterMs !== undefined)) {
    const wait = denial.retryAfterMs;
    const ms = Math.max(1, Math.ceil(wait !== undefined && Number.isFinite(wait) ? wait : 1000));
    headers['retry-after'] = String(Math.max(1, Math.ceil(ms / 1000)));
    headers['retry-after-ms'] = String(ms);
  }
  return { status, headers, body: text };
}

export function deny(code: ErrorCode, message: string, extra?: Omit<Denial, 'code' | 'message'>): Denial {
  return { code, message, ...extra };
}
