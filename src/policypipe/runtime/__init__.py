"""Running an exported policy: `PolicyRunner.load("data/policy").act(Observation.checked(...))`
returns absolute, timed targets (docs/runtime.md)."""
