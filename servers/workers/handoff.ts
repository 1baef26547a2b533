// A caller's connection handed from the front to the worker that owns its request (docs/multi-worker.md):
// the socket itself goes over the worker's IPC channel, with the bytes the front already read, and
// the worker serves it as if it had accepted it (the pattern of Node's cluster module and of
// @socket.io/sticky). The front relays no byte and keeps no descriptor of a call in flight.
//
// Why not a relay: over HTTP/2 (one connection per worker, a stream per call) Node's session stops
// reading its socket while one of its own writes is pending, so a burst both ways (replies released
// by a checkpoint one way, the next calls the other) stalled front and worker for good: the scale
// benchmark hung at 6,000 held episodes. Over HTTP/1.1 the front would hold two descriptors per
// parked call, the single process's ceiling again.
//
// A handed-off connection stays with its worker for the caller's next requests that the worker
// owns (kept-connections.ts); one it does not own is relayed, and the connection then closes.
import type { ChildProcess } from 'node:child_process';
import type { Server } from 'node:http';
import { Socket } from 'node:net';
import { type KeptConnectionOptions, serveKeptConnections } from './kept-connections.js';

interface HandoffMessage {
  ng_handoff: 1;
  /** What the front read from the connection (base64): the worker's parser starts with it. */
  bytes: string;
}

/** In the front: passes `socket` (nothing more read from it here) to `worker`. */
export function handOff(worker: ChildProcess, socket: Socket, bytes: Buffer): void {
  stopReading(socket);
  const message: HandoffMessage = { ng_handoff: 1, bytes: bytes.toString('base64') };
  // The front's copy of the descriptor is closed once the worker has it.
  worker.send(message, socket, { keepOpen: false }, (err) => {
    if (err) socket.destroy();
  });
}

/**
 * Stops reading `socket` here, its descriptor included. `pause()` stops only the stream: the handle
 * goes on reading (the stream itself restarts it after a chunk, to fill its buffer). A socket sent
 * to a worker stays open in this process until the worker acknowledges it, and whatever its handle
 * reads meanwhile is thrown away: the caller's next request on a kept connection, sent as soon as
 * the worker answered the first, could be read here and lost, and the caller would wait for ever.
 * Called just before the send; the paused stream asks for nothing more, so nothing starts the
 * handle again before the send takes it off the socket (also when the send waits in Node's queue).
 * Node has no public call for this; its own HTTP server stops a consumed socket the same way.
 */
function stopReading(socket: Socket): void {
  socket.pause();
  const handle = (socket as unknown as { _handle?: { reading?: boolean; readStop?: () => number } | null })._handle;
  if (handle?.reading && handle.readStop) {
    handle.reading = false;
    handle.readStop();
  }
}

/**
 * In a worker: serves every connection its front hands over on `server`, kept alive for the
 * requests this worker owns (kept-connections.ts).
 */
export function acceptHandoffs(server: Server, options: KeptConnectionOptions): void {
  const handedOff = new WeakSet<Socket>();
  serveKeptConnections(server, handedOff, options);
  process.on('message', (message: unknown, socket: unknown) => {
    if (!isHandoff(message) || !(socket instanceof Socket)) return;
    handedOff.add(socket);
    serveConnection(server, socket, Buffer.from(message.bytes, 'base64'));
  });
}

/** Serves `socket` on `server` as an accepted connection whose first `bytes` were already read. */
export function serveConnection(server: Server, socket: Socket, bytes: Buffer): void {
  server.emit('connection', socket);
  // Ahead of anything still to come on the socket.
  if (bytes.length > 0) socket.emit('data', bytes);
  socket.resume();
}

function isHandoff(message: unknown): message is HandoffMessage {
  return (
    typeof message === 'object' && message !== null && (message as HandoffMessage).ng_handoff === 1 && typeof (message as HandoffMessage).bytes === 'string'
  );
}
