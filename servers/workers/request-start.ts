// The start of a request as the front reads it off a fresh connection (docs/multi-worker.md): the
// request line and headers, and for an environment `/run` its body (the rollout is in it). Only
// what routing needs is parsed; the worker that gets the connection parses the request again, in
// full, with Node's own parser. The bytes are kept exactly as they came.
import type { Socket } from 'node:net';

/** Larger heads are handed to the front's own HTTP parser, which refuses them (431). */
export const MAX_HEAD_BYTES = 64 * 1024;

export interface RequestStart {
  /** Everything read from the connection so far, in order. */
  bytes: Buffer;
  method: string;
  /** The request target as sent (path and query). */
  target: string;
  headers: Map<string, string>;
  /** The body, when it was waited for (`wantBody`) and framed by a content-length. */
  body?: Buffer;
  /** The head could not be parsed, or was too large: the front's parser answers it. */
  malformed?: boolean;
}

/**
 * Reads from `socket` (flowing) until the head is complete, and then, if `wantBody` says so, the
 * content-length body. Resolves undefined when the connection closes first. The caller removes
 * nothing: the listener is gone once this settles.
 */
export function readRequestStart(socket: Socket, wantBody: (start: RequestStart) => boolean, maxBodyBytes: number): Promise<RequestStart | undefined> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let start: RequestStart | undefined;
    let bodyAt = -1;
    let bodyLength = 0;
    const finish = (result: RequestStart | undefined): void => {
      socket.off('data', onData);
      socket.off('close', onClose);
      resolve(result);
    };
    const onClose = (): void => finish(undefined);
    const onData = (chunk: Buffer): void => {
      chunks.push(chunk);
      size += chunk.length;
      const bytes = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
      if (chunks.length > 1) chunks.splice(0, chunks.length, bytes);
      if (!start) {
        const end = bytes.indexOf('\r\n\r\n');
        if (end < 0) {
          if (size > MAX_HEAD_BYTES) finish(malformed(bytes));
          return;
        }
        start = parseHead(bytes, end);
        if (!start) return finish(malformed(bytes));
        bodyAt = end + 4;
        const length = start.headers.get('content-length');
        if (!wantBody(start) || start.headers.has('transfer-encoding') || length === undefined || !/^\d+$/.test(length)) {
          return finish(start);
        }
        bodyLength = Number(length);
        if (bodyLength > maxBodyBytes) return finish(start);
      }
      start.bytes = bytes;
      if (bytes.length - bodyAt >= bodyLength) finish({ ...start, body: bytes.subarray(bodyAt, bodyAt + bodyLength) });
    };
    socket.on('data', onData);
    socket.once('close', onClose);
  });
}

function parseHead(bytes: Buffer, end: number): RequestStart | undefined {
  const lines = bytes.toString('latin1', 0, end).split('\r\n');
  const requestLine = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(lines[0] ?? '');
  if (!requestLine) return undefined;
  const headers = new Map<string, string>();
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(':');
    if (colon <= 0) return undefined;
    headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
  }
  return { bytes, method: requestLine[1]!, target: requestLine[2]!, headers };
}

function malformed(bytes: Buffer): RequestStart {
  return { bytes, method: '', target: '', headers: new Map(), malformed: true };
}
