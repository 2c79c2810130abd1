/** The Redis the tests share (scripts/test-preflight.mjs checks it answers, or starts one). */
export const TEST_REDIS_URL = process.env.KW_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
