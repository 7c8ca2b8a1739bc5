"""The state all connections of a gateway share (depth, flow, store quota, stops)."""
