"""Look at a Parquet dataset and write a Hydra config directory that trains on it:

python -m dlrm.data.inspect data/clicks --out myconf --label clicked
python -m dlrm.train -cd myconf model=mydata data=mydata
"""

from dlrm.data.inspect.cli import configs, main, write_configs
from dlrm.data.inspect.columns import Column, describe
from dlrm.data.inspect.sample import sample

__all__ = ["Column", "configs", "describe", "main", "sample", "write_configs"]
