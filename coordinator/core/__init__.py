"""Pure logic with no I/O: amounts, plans, pricing, usage, the token codec, key names and
snapshot building. Nothing here imports redis."""
