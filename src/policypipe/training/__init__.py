"""Training: samples from the dataset, the loop, checkpoints."""
