// Runs one memory participant as its own process:
//   tsx test/participants/memory-server.ts --instance env1 --kind environment [--port 0]
// Token from GYM_CONTROL_TOKEN. Prints `LISTENING <port>` once it accepts connections.
import { parseArgs } from 'node:util';
import { KindSchema } from '../../protocol/ids.js';
import { buildMemoryServer } from './memory-participant.js';

const { values } = parseArgs({
  options: {
    instance: { type: 'string' },
    kind: { type: 'string' },
    port: { type: 'string', default: '0' },
    'lease-grace-seconds': { type: 'string' },
  },
});
const token = process.env.GYM_CONTROL_TOKEN;
if (!values.instance || !values.kind || !token) {
  console.error('usage: memory-server --instance NAME --kind KIND [--port N]  (GYM_CONTROL_TOKEN set)');
  process.exit(2);
}
const { app } = await buildMemoryServer({
  instance: values.instance,
  kind: KindSchema.parse(values.kind),
  token,
  leaseGraceSeconds: values['lease-grace-seconds'] ? Number(values['lease-grace-seconds']) : undefined,
});
await app.listen({ host: '127.0.0.1', port: Number(values.port) });
const addr = app.server.address();
console.log(`LISTENING ${typeof addr === 'object' && addr ? addr.port : values.port}`);
for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => void app.close().then(() => process.exit(0)));
