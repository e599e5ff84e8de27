"""The context: the ExecutionContext facade and the per-call machinery (cancellation,
the token ledger, metered streams)."""
