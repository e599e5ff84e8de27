"""The Redis layer: the only code that imports ``redis`` (scripts, the write-behind wire,
tree operations, cross-tree views, the shield's script calls, execution session records)."""
