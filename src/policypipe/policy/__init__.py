"""The Diffusion Policy (Chi et al., 2023) as a self-contained module: config, model, normalizer."""
