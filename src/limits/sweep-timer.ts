/**
 * The sweep of a per-key table (bucket slices, slot blocks): runs every `everyMs` while the
 * table has entries and not at all while it is empty, unref'd so it never keeps a process up.
 */
export class SweepTimer {
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly sweep: () => void,
    private readonly everyMs: number,
  ) {}

  /** Starts or stops the timer to match whether the table has anything to sweep. */
  sync(active: boolean): void {
    if (active && !this.timer) {
      this.timer = setInterval(this.sweep, this.everyMs);
      this.timer.unref();
    } else if (!active && this.timer) this.stop();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}
