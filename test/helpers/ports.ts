import { connect } from 'node:net';

/**
 * A loopback address where a TCP connection is refused, and stays refused for the test: a
 * privileged port (below 1024) that nothing listens on. A port freed by freePort() is not enough:
 * under the suite's parallel load another test's server may bind it before the CLI connects, and
 * a connection to a free port in the ephemeral range can even meet itself (TCP self-connect).
 */
export async function refusedAddress(): Promise<string> {
  for (let port = 1; port < 1024; port++) {
    if (await refused(port)) return `127.0.0.1:${port}`;
  }
  throw new Error('every privileged port on 127.0.0.1 accepts connections');
}

function refused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    const done = (yes: boolean): void => {
      socket.destroy();
      resolve(yes);
    };
    socket.once('connect', () => done(false));
    socket.once('error', (err: NodeJS.ErrnoException) => done(err.code === 'ECONNREFUSED'));
  });
}
