"""A copy of an exported policy with the runtime monitor calibrated as the train stage calibrates it
(`monitor.calibration.calibrate`), for policies trained outside the pipeline (bench_seeds) or before
the monitor existed. The copy is written to a new folder; the policy's own is never changed.

    python -m tests.benchmarks.calibrate_monitor runs/plain/seed0/policy runs/plain/seed0/monitored \
        --dataset data/dataset.zarr --stats data/stats/stats.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import yaml

from policypipe.config import from_mapping
from policypipe.lineage.hashing import sha256_file
from policypipe.monitor.calibration import MonitorConfig, calibrate
from policypipe.policy.export import load_policy, require_trained_with, save_policy
from policypipe.runtime.spec import RuntimeSpec


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dataset", type=Path, default=Path("data/dataset.zarr"))
    parser.add_argument("--stats", type=Path, default=Path("data/stats/stats.json"))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="its monitor section")
    args = parser.parse_args()
    if args.out.resolve() == args.policy.resolve():
        parser.error("write the calibrated copy to another folder")
    require_trained_with(args.policy, sha256_file(args.stats), args.stats)
    config = from_mapping(MonitorConfig, yaml.safe_load(args.params.read_text()).get("monitor"), "monitor")
    policy, spec = load_policy(args.policy), RuntimeSpec.read(args.policy)
    stats = json.loads(args.stats.read_text())
    calibration = calibrate(policy, spec, args.dataset, stats["split"], config)
    lineage = json.loads((args.policy / "manifest.json").read_text()).get("lineage", {})
    runtime = json.loads((args.policy / "runtime.json").read_text())
    save_policy(args.out, policy, lineage | {"monitor": asdict(config)}, runtime, calibration.files())
    print(f"{args.out}: calibrated on {calibration.details['calibration']}")


if __name__ == "__main__":
    main()
