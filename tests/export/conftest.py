"""The bundle tests' session fixtures (tests/helpers/bundles.py): two trained models, each exported
and bundled once."""

from tests.helpers.bundles import criteo_job, parquet_job  # noqa: F401  (fixtures)
