"""Offline evaluation: predicted action chunks against recorded futures on held-out episodes."""
