// HTTP keep-alive between our clients and Gym servers. A client must drop an idle connection well
// before the server does: undici follows the server's `Keep-Alive: timeout=65` hint minus 1 s by
// default, so on a busy machine (event loops lagging by more than that second) a request could go
// out on a socket the server was closing, and fail with "other side closed" (1,596 of 15,200
// episode closes at 16,000 rollouts under the CPU profiler). Clients cap idle sockets at 30 s.
export const SERVER_KEEP_ALIVE_MS = 65_000;

/** undici Agent/Pool options: idle sockets live at most 30 s, whatever the server's hint. */
export const CLIENT_KEEP_ALIVE = { keepAliveTimeout: 30_000, keepAliveMaxTimeout: 30_000 } as const;
