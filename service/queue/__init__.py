"""The durable job queue: the jobs table, its claim/heartbeat/retry SQL and the worker loop."""
