/**
 * The admin CLI's client for the console's /admin/v1 API. The token comes from the
 * environment (KEYWARD_ADMIN_TOKEN), never from a flag, so it stays out of shell history
 * and process listings; error messages never include it.
 */
export class CliError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CliError';
  }
}

export const DEFAULT_CONSOLE_URL = 'http://127.0.0.1:7000';
export const TOKEN_ENV = 'KEYWARD_ADMIN_TOKEN';
export const URL_ENV = 'KEYWARD_CONSOLE_URL';

export interface AdminClientOptions {
  url: string;
  token: string;
  fetch?: typeof fetch;
}

export type AdminCall = <T = any>(method: string, path: string, body?: unknown) => Promise<T>;

export function adminClient(opts: AdminClientOptions): AdminCall {
  const base = opts.url.replace(/\/+$/, '');
  const doFetch = opts.fetch ?? fetch;
  return async (method, path, body) => {
    let res: Response;
    try {
      res = await doFetch(`${base}${path}`, {
        method,
        headers: { authorization: `Bearer ${opts.token}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        signal: AbortSignal.timeout(30_000),
      });
    } catch (err) {
      const cause = (err as { cause?: { code?: string } }).cause?.code;
      throw new CliError(`cannot reach the console at ${base}${cause ? ` (${cause})` : ''}`);
    }
    const text = await res.text();
    let json: any = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      throw new CliError(`the console answered ${res.status} with something that is not JSON`);
    }
    if (!res.ok) {
      const e = json?.error;
      const hint = res.status === 401 ? ` (check ${TOKEN_ENV})` : '';
      throw new CliError(`${res.status} ${e?.code ?? 'error'}: ${e?.message ?? 'request failed'}${hint}`);
    }
    return json;
  };
}

/** `none` clears a setting (null); anything else must be a number. */
export function numberOrNone(what: string, opts: { integer?: boolean } = {}) {
  return (raw: string): number | null => {
    if (raw === 'none') return null;
    const n = Number(raw);
    if (raw.trim() === '' || !Number.isFinite(n) || n < 0 || (opts.integer && !Number.isInteger(n))) {
      throw new CliError(`${what} must be a ${opts.integer ? 'whole ' : ''}number of 0 or more, or "none"`);
    }
    return n;
  };
}

/** A comma-separated model list; `none` (or `all`) means every model. */
export function modelList(raw: string): string[] | null {
  if (raw === 'none' || raw === 'all') return null;
  const list = raw.split(',').map((m) => m.trim()).filter(Boolean);
  if (list.length === 0) throw new CliError('--models needs at least one model glob, or "all"');
  return list;
}
