/**
 * The admin CLI's client for the console's /admin/v1 API. The token comes from the
 * environment (KEYWARD_ADMIN_TOKEN), never from a flag, so it stays out of shell history
 * and process listings; error messages never include it.
 */
import { isShadowCheck, SHADOW_CHECKS, type ShadowCheck } from '../protocol/shadow-checks.js';

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

/**
 * The console URL, checked before any call. fetch refuses a URL with user-info and its
 * error would name the whole URL, password and all: none of these messages quotes it.
 */
function consoleBase(raw: string): string {
  const what = `the console URL (--console or ${URL_ENV})`;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new CliError(`${what} is not a valid URL; expected one like ${DEFAULT_CONSOLE_URL}`);
  }
  if (url.username !== '' || url.password !== '') {
    throw new CliError(`${what} must not carry user-info (user:password@): the token in ${TOKEN_ENV} authenticates the calls`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new CliError(`${what} must be an http:// or https:// URL`);
  return raw.replace(/\/+$/, '');
}

export function adminClient(opts: AdminClientOptions): AdminCall {
  const base = consoleBase(opts.url);
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
    let json: any;
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

/** `--ips 10.0.0.0/8,192.168.0.0/16`; `none` (or `any`) lifts the restriction. Checked by the console. */
export function ipList(raw: string): string[] | null {
  if (raw === 'none' || raw === 'any') return null;
  const list = raw.split(',').map((s) => s.trim()).filter(Boolean);
  if (list.length === 0) throw new CliError('--ips needs at least one CIDR range such as 10.0.0.0/8, or "none"');
  return list;
}

export interface ModelLimitSpec { models: string; rpm: number | null; tpm: number | null }

/**
 * One `--model-limit 'gpt-4o*:rpm=10,tpm=20000'`. The glob is everything before the last
 * `:` that starts the limits, so globs with colons (`llama3:8b*`) work; a limit left out,
 * or given as `none`, is no limit.
 */
export function modelLimitSpec(raw: string): ModelLimitSpec {
  const m = /^(.+):((?:rpm|tpm)=[^,:]*(?:,(?:rpm|tpm)=[^,:]*)*)$/.exec(raw.trim());
  if (!m) throw new CliError(`--model-limit must look like 'gpt-4o*:rpm=10,tpm=20000', got '${raw}'`);
  const out: ModelLimitSpec = { models: m[1]!, rpm: null, tpm: null };
  const seen = new Set<string>();
  for (const part of m[2]!.split(',')) {
    const [name, value] = part.split('=') as ['rpm' | 'tpm', string];
    if (seen.has(name)) throw new CliError(`--model-limit names ${name} twice in '${raw}'`);
    seen.add(name);
    out[name] = numberOrNone(`--model-limit ${name}`, { integer: true })(value);
  }
  return out;
}

/** Repeatable `--model-limit`: entries in the order given (the first match applies); `none` clears them. */
export function modelLimits(raw: string[]): ModelLimitSpec[] | null {
  if (raw.length === 1 && raw[0] === 'none') return null;
  return raw.map(modelLimitSpec);
}

/** `--budget-period day|week|month|none` */
export function budgetPeriodArg(raw: string): 'day' | 'week' | 'month' | null {
  if (raw === 'none') return null;
  if (raw === 'day' || raw === 'week' || raw === 'month') return raw;
  throw new CliError('--budget-period must be day, week, month or none');
}

/** `--shadow rpm,tpm`: the checks a key evaluates without enforcing; `none` clears them. */
export function shadowList(raw: string): ShadowCheck[] {
  if (raw.trim() === 'none') return [];
  const list = raw.split(',').map((s) => s.trim()).filter(Boolean);
  const unknown = list.filter((c) => !isShadowCheck(c));
  if (list.length === 0 || unknown.length > 0) {
    throw new CliError(`--shadow takes a comma-separated list of ${SHADOW_CHECKS.join(', ')}, or "none"${unknown.length ? `; unknown: ${unknown.join(', ')}` : ''}`);
  }
  return [...new Set(list as ShadowCheck[])];
}
