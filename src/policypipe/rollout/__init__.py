"""Closed-loop episodes in the synthetic sample scene: the runtime drives the simulator."""
