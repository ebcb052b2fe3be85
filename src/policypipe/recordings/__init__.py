"""Reading an export: pairing its files, its MCAP streams (camera frames, poses, widths), checks
before hashing, and the HDF5 sources (robomimic, ALOHA)."""
