"""policypipe: from handheld-gripper demonstrations to a trained, evaluated Diffusion Policy."""

__version__ = "0.1.0"
