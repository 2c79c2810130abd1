/**
 * The keyward modules a benchmark server runs. Production runs the compiled build (`npm run
 * build`, plain node), so the benchmark does too: KW_BENCH_BUILD names a directory that
 * `scripts/build.mjs --out` wrote (bench/lib/servers.ts builds it). Without it, src/ runs
 * through tsx, which adds its own work to the request path (a `__name` call per closure made).
 */
import { pathToFileURL } from 'node:url';

const base = process.env.KW_BENCH_BUILD ? pathToFileURL(`${process.env.KW_BENCH_BUILD}/`) : new URL('../../src/', import.meta.url);

/** `path` under src/, e.g. 'app/sidecar.js', from the build when there is one. */
export const load = <T>(path: string): Promise<T> => import(new URL(path, base).href) as Promise<T>;
