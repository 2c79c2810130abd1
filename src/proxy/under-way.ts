/** A count of things under way, and a bounded wait for there to be none. */
export class UnderWay {
  private count = 0;
  private waiter: (() => void) | null = null;

  start(): void {
    this.count++;
  }

  end(): void {
    if (--this.count === 0) this.waiter?.();
  }

  /** Resolves when none is under way, or after `timeoutMs`. */
  none(timeoutMs: number): Promise<void> {
    if (this.count === 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.waiter = null;
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      this.waiter = done;
    });
  }
}
