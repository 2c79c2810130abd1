/**
 * One spend slice as this instance holds it, and the figures that size and age slices
 * (spend-slices.ts says how slices are granted, used and settled).
 */
import type { LeaseTicket } from '../leases.js';
import type { Holder } from '../../policy/holders.js';
import type { SpendSliceWrite } from './settle-batch.js';

/** A slice is at most 1/SPEND_SLICE_SHARE of what the holder has left (hold.lua). */
export const SPEND_SLICE_SHARE = 16;
/** A slice must cover this many holds like the one that asks for it, or it saves nothing. */
export const SPEND_SLICE_COVER = 2;
/** Longest a slice is used: a new epoch applies within a second (DESIGN section 6). */
export const SPEND_SLICE_MAX_MS = 1000;
/** A live slice whose settlements carry nothing is asked about (is it void?) at most this often. */
export const SPEND_SLICE_CHECK_MS = 50;

export interface SpendSlice {
  id: string;
  /** the holder's ledger hash and hold set */
  keys: [string, string];
  tag: string;
  kind: Holder['kind'];
  /** the holder's figures it was granted under */
  epoch: number;
  base: number;
  limit: number | null;
  /** nano-units Redis records for it (as far as this instance has told Redis) */
  record: number;
  /** nano-units of the holds in flight on it, and how many they are */
  inFlight: number;
  holds: number;
  /** the holds in flight Redis records for it (hold.lua: 0 at the grant; then its settlements' reports) */
  reported: number;
  /** this clock: no hold is taken from it from then on */
  until: number;
  /** false once given back: it only settles the holds still in flight on it */
  live: boolean;
  /** a settlement that tells Redis it was given back has been written */
  toldGivenBack: boolean;
  /** this clock: when its grant or its last settlement left for Redis */
  asked: number;
  kept: LeaseTicket;
  /** its settlement gathering in the batch (until sent) */
  write: SpendSliceWrite | null;
}
