/**
 * One lease.lua call as the lease path (lease-path.ts) builds and reads it: the names of a
 * key's buckets and lease set, what the call gives back and asks for, and what its refusal
 * says of other instances' slices.
 */
import type { Block } from './slot-blocks.js';
import type { Slice, Want } from './slices.js';

/** The names of a key's buckets and lease set, under its hash tag. */
export interface KeyNames {
  tag: string;
  rpm: string;
  tpm: string;
  conc: string;
  /** the lease set's version 2 block weights (slots.lua), read by the scripts and never written */
  concw: string;
}

/** One lease.lua call: what it gives back, what it asks for, and the ids it uses. */
export interface LeaseAsk {
  keys: KeyNames;
  /** the key's slice until now, given back in the call */
  old: Slice | null;
  /** the slice asked for */
  want: Want | null;
  /** the block weight asked for, 0 = none */
  wantBlock: number;
  sliceId: string;
  /** this request's own slot ('' without a concurrency limit) */
  slotId: string;
  /** the key's block, held or asked for ('' = none) */
  blockId: string;
  /** the key's block when the call was sent */
  had: Block | null;
  /** performance.now() when the call was sent */
  sentAt: number;
}

export const keyNames = (tag: string): KeyNames => ({ tag, rpm: `${tag}:rpm`, tpm: `${tag}:tpm`, conc: `${tag}:conc`, concw: `${tag}:concw` });

/** A refusal lease.lua says other instances' slices caused, which it told them to give back. */
export const slicesInTheWay = (reply: unknown): boolean => Array.isArray(reply) && Number(reply[0]) === 0 && Number(reply[11]) === 1;
