"""The runtime: the Coordinator (connection and wiring), settings, background work and the
stop listener."""
