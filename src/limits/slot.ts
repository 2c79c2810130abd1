/**
 * Redis Cluster hash slot of a key (CRC16/XMODEM of the hash tag, mod 16384), computed here
 * so the limiter can tell which shard an admission depends on before it sends anything.
 */
const TABLE = new Uint16Array(256);
for (let i = 0; i < 256; i++) {
  let c = i << 8;
  for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
  TABLE[i] = c;
}

export function keySlot(key: string): number {
  // Only the part inside the first non-empty {...} is hashed, as Redis does.
  const open = key.indexOf('{');
  if (open >= 0) {
    const close = key.indexOf('}', open + 1);
    if (close > open + 1) key = key.slice(open + 1, close);
  }
  let crc = 0;
  for (const byte of Buffer.from(key, 'utf8')) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ byte) & 0xff]!;
  return crc & 16383;
}

/**
 * Items grouped by the hash slot of the tag `tagOf` names (one group in all when `cluster` is false),
 * each group cut into calls of at most `max`: one script call may only touch one slot, and
 * Redis serves nothing else while a script runs.
 */
export function callsBySlot<T>(items: T[], o: { cluster: boolean; tagOf: (item: T) => string; max: number }): T[][] {
  const groups = new Map<number, T[]>();
  for (const item of items) {
    const slot = o.cluster ? keySlot(o.tagOf(item)) : 0;
    let list = groups.get(slot);
    if (!list) groups.set(slot, (list = []));
    list.push(item);
  }
  const calls: T[][] = [];
  for (const list of groups.values()) for (let i = 0; i < list.length; i += o.max) calls.push(list.slice(i, i + o.max));
  return calls;
}
