/**
 * Anchored `*` globs (key scopes, per-model limits, prices), matched in time linear in
 * the input whatever the glob: literal segments are found left to right with indexOf,
 * never by backtracking. Pure.
 */

export function globMatch(glob: string, input: string): boolean {
  const parts = glob.split('*');
  if (parts.length === 1) return glob === input;
  const first = parts[0]!;
  const last = parts[parts.length - 1]!;
  if (input.length < first.length + last.length || !input.startsWith(first) || !input.endsWith(last)) return false;
  let at = first.length;
  const end = input.length - last.length;
  for (let i = 1; i < parts.length - 1; i++) {
    const seg = parts[i]!;
    if (seg === '') continue;
    const found = input.indexOf(seg, at);
    // The leftmost match leaves the most room for what follows, so it is the only one to try.
    if (found === -1 || found + seg.length > end) return false;
    at = found + seg.length;
  }
  return true;
}
