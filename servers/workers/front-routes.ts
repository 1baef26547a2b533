// The routes a multi-worker server's front answers itself (docs/multi-worker.md): health, the
// server's metrics, the control routes as the one participant, and the workers' own metrics path
// (404 to anyone but the front). Every other request belongs to the worker that owns it.
import { CONTROL_PREFIX } from '../../protocol/control.js';
import { WORKER_METRICS_PATH } from '../common/metrics.js';

export function isFrontRoute(target: string): boolean {
  const path = target.split('?')[0]!;
  return path === '/healthz' || path === '/metrics' || path.startsWith(`${CONTROL_PREFIX}/`) || path === WORKER_METRICS_PATH;
}
