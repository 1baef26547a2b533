// HTTP keep-alive between our clients and Gym servers. A client must drop an idle connection well
// before the server does: undici follows the server's `Keep-Alive: timeout=65` hint minus 1 s by
// default, so on a busy machine (event loops lagging by more than that second) a request can go
// out on a socket the server is closing and fail with "other side closed". Clients cap idle
// sockets at 30 s, which also frees descriptors sooner after a burst of held calls is released.
export const SERVER_KEEP_ALIVE_MS = 65_000;

/** undici Agent/Pool options: idle sockets live at most 30 s, whatever the server's hint. */
export const CLIENT_KEEP_ALIVE = { keepAliveTimeout: 30_000, keepAliveMaxTimeout: 30_000 } as const;

/**
 * The listen backlog of every Gym server (the kernel caps it at net.core.somaxconn). A checkpoint's
 * resume lets thousands of held episodes go at once, and each may open a connection in the same
 * instant; Node's default of 511 dropped the rest of such a burst (connect timeouts at 6,000 held).
 */
export const SERVER_LISTEN_BACKLOG = 65_535;
