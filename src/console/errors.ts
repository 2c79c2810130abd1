import { withoutKeys } from '../auth/keyformat.js';

/**
 * Errors the admin and sync APIs answer with: `{"error":{"code","message"}}` and the status.
 * Messages name ids and fields, never a key, a token or the master key.
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** 405 with the `Allow` header RFC 9110 asks for: the methods the path answers. */
export class MethodNotAllowed extends ApiError {
  constructor(readonly allow: readonly string[]) {
    super(405, 'method_not_allowed', `method not allowed on this path; allowed: ${allow.join(', ')}`);
  }
}

/** The id as the caller sent it, less a key pasted in its place (`keys delete <the key>`): the CLI prints this message. */
export const notFound = (what: string, id: string) => new ApiError(404, 'not_found', `${what} ${withoutKeys(id)} does not exist`);
export const invalid = (message: string) => new ApiError(400, 'invalid_request', message);
export const conflict = (message: string) => new ApiError(409, 'conflict', message);
