/**
 * Whether Redis may evict keyward's keys. Every key keyward writes carries a TTL, so a
 * `volatile-*` policy takes them first and an `allkeys-*` one takes them with the rest; a
 * rate bucket, concurrency slot or spend ledger evicted is a limit no longer enforced, with
 * no error anywhere. Only `noeviction` (or no `maxmemory`) keeps them. Read from each
 * master's `INFO memory` when the connection comes up, and said once per node in a warning.
 */
import type { Cluster, Redis } from 'ioredis';

export interface EvictionRisk {
  node: string;
  policy: string;
  maxmemory: number;
}

/** `INFO memory`'s answer read: a risk when maxmemory is set and the policy evicts. */
export function evictionRiskOf(info: string, node: string): EvictionRisk | null {
  const field = (name: string) => new RegExp(`^${name}:(.*)$`, 'm').exec(info)?.[1]?.trim();
  const maxmemory = Number(field('maxmemory') ?? 0);
  const policy = field('maxmemory_policy') ?? 'noeviction';
  return maxmemory > 0 && policy !== 'noeviction' ? { node, policy, maxmemory } : null;
}

/** The masters whose settings may evict keyward's keys; a node that does not answer is left out. */
export async function evictionRisks(client: Redis | Cluster): Promise<EvictionRisk[]> {
  const nodes = client.isCluster ? (client as Cluster).nodes('master') : [client as Redis];
  const risks = await Promise.all(
    nodes.map(async (node) => {
      try {
        return evictionRiskOf(await node.info('memory'), `${node.options.host ?? ''}:${node.options.port ?? ''}`);
      } catch {
        return null;
      }
    }),
  );
  return risks.filter((r): r is EvictionRisk => r !== null);
}
