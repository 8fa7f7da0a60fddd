"""Core: plain data and what the kernel says, used by every layer (results, steps, memory readings,
sizes, registries, safe file reading, leftovers). Imports nothing above it."""
