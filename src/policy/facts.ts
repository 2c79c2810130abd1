/**
 * What the decision core knows about one key: the key, its project and its owner's
 * wallet, as the replica returns them in one lookup. Defined here, beside the decisions
 * that read it; the replica produces it and the proxy carries it.
 */
import type { ShadowCheck } from '../protocol/shadow-checks.js';

export interface FactsKey {
  id: string;
  kind: 'personal' | 'team';
  userId: string | null;
  projectId: string | null;
  status: 'active' | 'deleted';
  budget: number | null;
  spent: number;
  models: string[] | null;
  routing: string | null;
  rpm: number | null;
  tpm: number | null;
  concurrency: number | null;
  /** bumped by the console when it changes the key's figures for another reason than usage */
  epoch: number;
  /** CIDR ranges the client address must fall in; null: anywhere */
  ips: string[] | null;
  allowBrowser: boolean;
  /** per-model limits in addition to the key's own; the first matching entry applies */
  modelLimits: ModelLimit[] | null;
  /** UTC calendar period of the key's budget */
  period: 'day' | 'week' | 'month' | null;
  /** checks evaluated but not enforced for this key, besides the config's (DESIGN section 12) */
  shadow: readonly ShadowCheck[];
}

export interface ModelLimit {
  models: string;
  rpm: number | null;
  tpm: number | null;
}

export interface FactsProject {
  id: string;
  status: 'enabled' | 'disabled';
  budget: number | null;
  spent: number;
  epoch: number;
  /** UTC calendar period of the project's budget (optional: facts built before it existed lack it) */
  period?: 'day' | 'week' | 'month' | null;
}

/** Everything the policy needs about one key. */
export interface KeyFacts {
  key: FactsKey;
  project: FactsProject | null;
  /** null when the console sent no wallet for the key's user */
  walletBalance: number | null;
  /** null when no wallet row */
  walletEpoch: number | null;
}
