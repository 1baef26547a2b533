// Where a response "starts" (participants.md §5.2 step 4): the first body chunk that carries data.
// Empty chunks never do; in an event stream, SSE comment lines (`: keep-alive`) and blank lines do
// not either, so a keep-alive sent while a call is held does not count as delivery.

export class ResponseStartDetector {
  private started = false;
  private atLineStart = true;
  private inComment = false;

  constructor(private readonly eventStream: boolean) {}

  get hasStarted(): boolean {
    return this.started;
  }

  /** Feeds the next chunk; true once any chunk so far carried data. */
  push(chunk: Uint8Array): boolean {
    if (this.started || chunk.length === 0) return this.started;
    if (!this.eventStream) return (this.started = true);
    // Lines may be split across chunks, so the scanner keeps its place between calls.
    for (const byte of chunk) {
      if (byte === 0x0a || byte === 0x0d) {
        this.atLineStart = true;
        this.inComment = false;
      } else if (this.atLineStart) {
        this.atLineStart = false;
        if (byte !== 0x3a /* ':' */) return (this.started = true);
        this.inComment = true;
      } else if (!this.inComment) {
        return (this.started = true);
      }
    }
    return false;
  }
}
