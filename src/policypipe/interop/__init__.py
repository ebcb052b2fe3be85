"""Other tools' dataset formats: export to LeRobotDataset v3.0 (docs/interop.md)."""
