export type SearchAttributeType = 'Text' | 'Keyword' | 'Int' | 'Double' | 'Bool' | 'Datetime' | 'KeywordList';

export interface DevServerOptions {
  /** gRPC port on 127.0.0.1; default 7233. */
  port?: number;
  /** Web UI port; default 8233. Ignored when headless. */
  uiPort?: number;
  /** SQLite file, relative to the project root; default `.data/temporal.sqlite`; null = in memory. */
  dbFile?: string | null;
  headless?: boolean;
  /** Extra namespace to create and wait for; `default` always exists. */
  namespace?: string;
  /** Replaces DEFAULT_SEARCH_ATTRIBUTES. */
  searchAttributes?: Record<string, SearchAttributeType>;
  /** Merged over DEFAULT_DYNAMIC_CONFIG; values are JSON-encoded. */
  extraDynamicConfig?: Record<string, string | number | boolean>;
  logLevel?: 'debug' | 'info' | 'warn' | 'error' | 'never';
  /** How long to wait for the frontend; default 60 s. */
  readyTimeoutMs?: number;
  /** 'file' (default): server output appended to logFile; 'inherit': to our stdout/stderr. */
  output?: 'file' | 'inherit';
  /** Default `<dbFile>.log`, or a temp file when in memory. */
  logFile?: string;
  /** Default: the CLI resolved by bootstrap (.tools/temporal.json). */
  cliPath?: string;
}

export interface DevServer {
  /** host:port for Connection / NativeConnection. */
  address: string;
  namespace: string;
  /** e.g. http://127.0.0.1:8233; undefined when headless. */
  uiUrl: string | undefined;
  pid: number | undefined;
  logFile: string | undefined;
  dbFile: string | null;
  /** Settles when the server process exits. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>;
  /** SIGTERM to the process group, wait up to timeoutMs (default 10 s), then SIGKILL. */
  stop(timeoutMs?: number): Promise<void>;
  /** Leave the server running after this process exits (otherwise it is killed on exit). */
  keepRunning(): void;
}

export const DEFAULT_SEARCH_ATTRIBUTES: Readonly<Record<string, SearchAttributeType>>;
export const DEFAULT_DYNAMIC_CONFIG: Readonly<Record<string, string | number | boolean>>;
export function startDevServer(options?: DevServerOptions): Promise<DevServer>;
export function freePort(): Promise<number>;
export function isPortFree(port: number): Promise<boolean>;
