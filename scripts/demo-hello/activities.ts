// The demo's only activity: where real work (HTTP to a Gym server, disk) would happen.
export async function composeGreeting(name: string): Promise<string> {
  return `Hello, ${name}! (from an activity, pid ${process.pid})`;
}
