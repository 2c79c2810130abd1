// The admin API, called with the signed-in token. The token lives in sessionStorage (this
// tab only, gone when it closes) and travels only in the Authorization header: never in a
// URL, a cookie or a log line.
const SLOT = 'keyward.console.token';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const session = {
  token: () => sessionStorage.getItem(SLOT),
  set: (token) => sessionStorage.setItem(SLOT, token),
  clear: () => sessionStorage.removeItem(SLOT),
};

/** Encodes one path segment (ids may hold `@` and `.`). */
export const seg = (id) => encodeURIComponent(id);

export async function api(method, path, body) {
  const headers = { authorization: `Bearer ${session.token() ?? ''}` };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(path, {
    method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // a non-JSON answer (a proxy's error page): reported by status below
  }
  if (!res.ok) throw new ApiError(res.status, data?.error?.code ?? 'error', data?.error?.message ?? `HTTP ${res.status}`);
  return data;
}
