"""Helpers shared by the test modules (test modules import from here, never from each other).

harness: run a function on local Gloo ranks (simulated nodes too). families: the shared launches
and the `runs` declaration of the distributed tests. workers: the common rank functions (train and
report). reference: the unsharded single-process model trained on the same global batches.
equivalence: the small config of the equivalence tests and the sharded == unsharded assertion.
criteo: the real Criteo sample rows; criteo_data: a small preprocessed directory of them, and
ways to damage it; checkpoints: a small real checkpoint and ways to damage it. pages: a docs
page's commands run as written, in the test's process.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: conf/, launch/, docs/
