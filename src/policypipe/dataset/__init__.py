"""The training dataset: its zarr layout, and conversion of recordings into it."""
