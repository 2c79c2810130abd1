/**
 * A content-type's parameters, read only where every common parser reads them alike:
 * Express's reader (the `content-type` package) keeps the last of a parameter named twice
 * and reads quoted strings, a first-match expression takes the first and reads into them.
 * Pure.
 */

/**
 * The parameters after a media type (`; a=b; c="d"`, names lower-cased), or null where
 * parsers could read them another way: a parameter named twice, or one that does not parse
 * (a quote left open hides what follows from some).
 */
export function parameterList(text: string): Map<string, string> | null {
  const params = new Map<string, string>();
  let rest = text;
  while (rest !== '') {
    const p = /^;\s*([^\s=;"]+)\s*=\s*(?:"([^"]*)"|([^\s;"]*))\s*/.exec(rest) ?? /^;\s*$/.exec(rest);
    if (!p) return null;
    if (p[1] !== undefined) {
      const key = p[1].toLowerCase();
      if (params.has(key)) return null;
      params.set(key, p[2] ?? p[3]!);
    }
    rest = rest.slice(p[0].length);
  }
  return params;
}

/**
 * Why a JSON body's content-type is refused, or null. JSON is UTF-8 (RFC 8259), but a
 * decoder that honours a declared charset (body-parser takes any `utf-` one, UTF-7 among
 * them) reads other text, and other names than the one keyward checked.
 */
export function jsonCharsetRefusal(contentType: string): string | null {
  const semi = contentType.indexOf(';');
  if (semi < 0) return null;
  const params = parameterList(contentType.slice(semi).trim());
  if (params === null) return 'The Content-Type has parameters that parsers read differently (one named twice, or one that does not parse).';
  if ([...params.keys()].some((k) => k.startsWith('charset*'))) return 'The Content-Type has an encoded charset parameter; declare charset=utf-8 or none.';
  const charset = params.get('charset')?.toLowerCase();
  if (charset !== undefined && charset !== 'utf-8' && charset !== 'utf8') return 'JSON request bodies must be UTF-8; drop the charset parameter or declare utf-8.';
  return null;
}
