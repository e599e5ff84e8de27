"""The shield: the hook pipeline and its hooks (circuit breaker, budget windows, egress
deny list, policy)."""
