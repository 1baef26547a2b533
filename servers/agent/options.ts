// Options of the Simple Agent server (`servers.<name>.options`, docs/gym-servers.md).
import { z } from 'zod';

export const AgentOptionsSchema = z.strictObject({
  /** The policy model server this agent calls (a server name of kind `model`). */
  model: z.string().min(1),
  /** Model calls per activation; the loop stops after the tool round of the last one. */
  max_steps: z.number().int().positive().default(8),
  /** true: full participant (sessions park and are exported); false: restart-only (§3.8). */
  checkpoint_sessions_supported: z.boolean().default(true),
  /** How long a close reply is kept for a retried close (§3.2). */
  session_close_retry_window_seconds: z.number().min(0).finite().default(300),
});
export type AgentOptions = z.infer<typeof AgentOptionsSchema>;
