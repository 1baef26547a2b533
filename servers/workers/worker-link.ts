// The front's connection to one worker of a multi-worker server (docs/multi-worker.md): HTTP/2
// over the worker's Unix socket, every call a stream on one connection, so thousands of parked
// calls cost the front one descriptor per caller, not two.
import http2, { type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import net from 'node:net';

/** Flow-control window of a front–worker connection (both directions), bytes. */
export const CONNECTION_WINDOW = 1 << 30;

export class WorkerLink {
  private session: ClientHttp2Session | undefined;

  constructor(private readonly socketPath: string) {}

  /** A new stream; the body (if any) is sent whole. */
  request(headers: http2.OutgoingHttpHeaders, body?: Buffer | string): ClientHttp2Stream {
    const hasBody = body !== undefined && body.length > 0;
    const stream = this.connected().request(headers, { endStream: !hasBody });
    if (hasBody) stream.end(body);
    return stream;
  }

  /** A JSON call: status and parsed body (undefined when the body is not JSON). */
  async json(method: 'GET' | 'POST', path: string, headers: Record<string, string>, body?: string): Promise<{ status: number; text: string }> {
    const stream = this.request({ ':method': method, ':path': path, ...headers }, body);
    const head = await responseOf(stream);
    stream.setEncoding('utf8');
    let text = '';
    for await (const chunk of stream) text += chunk as string;
    return { status: Number(head[':status']), text };
  }

  close(): void {
    this.session?.close();
  }

  private connected(): ClientHttp2Session {
    if (!this.session || this.session.closed || this.session.destroyed) {
      const session = http2.connect('http://worker', {
        createConnection: () => net.connect(this.socketPath),
        // Room for every parked call's buffers; the worker sets no stream cap either.
        maxSessionMemory: 4096,
        peerMaxConcurrentStreams: 1_000_000,
      });
      // Each stream reports its own failure; a dead worker takes the server down anyway.
      session.on('error', () => undefined);
      // One slow reader must not hold every other stream back: the connection's window is large.
      session.once('connect', () => session.setLocalWindowSize(CONNECTION_WINDOW));
      this.session = session;
    }
    return this.session;
  }
}

/** The response head of a stream; rejects if the stream ends or fails without one. */
export function responseOf(stream: ClientHttp2Stream): Promise<http2.IncomingHttpHeaders> {
  return new Promise((resolve, reject) => {
    stream.once('response', resolve);
    stream.once('error', reject);
    stream.once('close', () => reject(new Error(`the worker closed the stream (code ${stream.rstCode})`)));
  });
}
