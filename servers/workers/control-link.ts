// The front's control connection to one worker of a multi-worker server (docs/multi-worker.md):
// plain HTTP/1.1 over the worker's Unix socket. Only the control plane (a few calls per
// checkpoint, fanned out to every worker) and `/metrics` use it; callers' requests never pass
// through the front (handoff.ts).
import { Pool } from 'undici';

/** Control calls in flight to one worker at once (prepare may wait, status and renew go beside it). */
const CONNECTIONS = 8;

export class ControlLink {
  private readonly pool: Pool;

  constructor(socketPath: string, connections = CONNECTIONS) {
    // No timeouts here: a control call's deadline is the controller's (it gives up, then resumes).
    this.pool = new Pool('http://worker', { socketPath, connections, headersTimeout: 0, bodyTimeout: 0 });
  }

  /** One call: its status and body text. */
  async call(method: 'GET' | 'POST', path: string, headers: Record<string, string>, body?: string): Promise<{ status: number; text: string }> {
    const res = await this.pool.request({ method, path, headers, ...(body !== undefined ? { body } : {}) });
    return { status: res.statusCode, text: await res.body.text() };
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}
