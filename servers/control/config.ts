// The global `checkpoint:` block (control-plane.md §12.1). Closed: an unknown key fails startup,
// and the block is validated even when checkpointing is off.
import { z } from 'zod';

export const CheckpointBlockSchema = z
  .strictObject({
    enabled: z.boolean().default(false),
    control_auth_token: z.string().nullable().default(null),
    lease_grace_seconds: z.number().positive().finite().default(600),
  })
  .superRefine((b, ctx) => {
    if (b.enabled && !b.control_auth_token) {
      ctx.addIssue({
        code: 'custom',
        path: ['control_auth_token'],
        message: 'checkpoint.control_auth_token is required and non-empty when checkpoint.enabled is true',
      });
    }
  });

export type CheckpointBlock = z.infer<typeof CheckpointBlockSchema>;
