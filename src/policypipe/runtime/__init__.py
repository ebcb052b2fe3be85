"""Running an exported policy: `PolicyRunner.load("data/policy").act(Observation.checked(...))`
returns absolute, timed targets (docs/runtime.md); a joint-space policy's runner, taking
`JointObservation`s and returning joint commands, is `joint_runner.JointPolicyRunner`
(`joint_runner.load_runner` picks the one a policy needs)."""
