/**
 * The current time as ISO 8601 text, exactly as `Date.prototype.toISOString` writes it,
 * for the access line's `time` and a usage event's `at`. Every request writes one, and
 * toISOString formats the whole date each time: here the text up to the second is made
 * once per second, and the text of a millisecond once (docs/performance.md, "Other cuts on
 * the request path").
 */

/** A clock that answers `now()` (whole milliseconds since the epoch, as Date.now) as ISO text; `now` is injectable for tests. */
export function isoClock(now: () => number = Date.now): () => string {
  let lastMs = Number.NaN;
  let lastText = '';
  /** the second being written, and its text through the decimal point */
  let secondStart = Number.NaN;
  let prefix = '';
  return () => {
    const ms = now();
    if (ms === lastMs) return lastText;
    lastMs = ms;
    let into = ms - secondStart;
    // NaN (the first call) fails both comparisons: a new second.
    if (!(into >= 0 && into < 1000)) {
      into = ((ms % 1000) + 1000) % 1000;
      secondStart = ms - into;
      // "….ss.sssZ" without "sssZ", whatever the year's width
      prefix = new Date(secondStart).toISOString().slice(0, -4);
    }
    lastText = `${prefix}${into < 10 ? '00' : into < 100 ? '0' : ''}${into}Z`;
    return lastText;
  };
}
