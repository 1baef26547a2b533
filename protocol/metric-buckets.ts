// Histogram buckets in seconds shared by the Gym servers' and the worker's Prometheus metrics:
// from a resume that only reopens to a prepare or commit with a long deadline.
export const SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
