export function registerCommand(namespace: string, name: string, type: string): string;
export function ensureSearchAttributes(
  connection: {
    operatorService: {
      listSearchAttributes(req: { namespace: string }): Promise<{ customAttributes?: Record<string, number> | null }>;
      addSearchAttributes(req: { namespace: string; searchAttributes: Record<string, number> }): Promise<unknown>;
    };
  },
  namespace: string,
  wanted?: Readonly<Record<string, string>>,
): Promise<string[]>;
