"""The runtime monitor: at every chunk, whether what the policy sees lies outside its training data
and whether it still agrees with itself, calibrated on the validation episodes (docs/runtime.md,
"The monitor")."""
