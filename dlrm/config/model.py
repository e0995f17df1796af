"""The model section: DLRM's layer sizes, interaction and embedding tables."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from omegaconf import MISSING

from dlrm.config.checks import _fail, _require_positive
from dlrm.config.choices import Interaction, PoolingType, Precision, ShardingType, VocabularyPolicy


@dataclass
class VocabularyConfig:
    """A table's managed vocabulary: raw ids (any int64 but 2**63 - 1, e.g. 63-bit user ids or hashed
    strings) are mapped to rows by TorchRec's managed-collision module (MCH) instead of indexing the table.

    An id gets a row of its own while the table has room (admitted at the step it is first seen); when
    the table is full a new id replaces the lowest-scoring admitted one under `policy`, whose row is
    reset to its initial values. The table's last row serves every id without a row (not yet admitted,
    or unseen at evaluation): the vocabulary holds `rows - 1` ids.
    """

    policy: VocabularyPolicy = VocabularyPolicy.none
    """none: ids index the table directly (in [0, rows)); lfu: evict the least frequently seen id; lru:
    the least recently seen; distance_lfu: the lowest count / (steps since last seen + 1)^decay_exponent."""
    decay_exponent: float = 1.0
    """The exponent of the age in the lru and distance_lfu scores."""
    max_age_steps: int | None = None
    """Evict ids not seen for more than this many training steps even when the table has room (lru and
    distance_lfu, which record when each id was last seen); None: only a full table evicts."""

    @property
    def managed(self) -> bool:
        """Whether the table maps ids through a managed vocabulary."""
        return self.policy != VocabularyPolicy.none

    def check(self, key: str, rows: int) -> None:
        if not self.managed:
            if self.max_age_steps is not None:
                _fail(f"{key}.max_age_steps", self.max_age_steps, "an age limit needs a vocabulary: set policy: lru")
            return
        if rows < 2:
            _fail(f"{key}", str(self.policy), "a managed vocabulary needs rows >= 2 (the last row serves unknown ids)")
        _require_positive(f"{key}.decay_exponent", self.decay_exponent)
        if self.max_age_steps is not None:
            _require_positive(f"{key}.max_age_steps", self.max_age_steps)
            if self.policy == VocabularyPolicy.lfu:
                _fail(
                    f"{key}.max_age_steps",
                    self.max_age_steps,
                    "lfu records no time of last use: use policy: lru or distance_lfu, or drop the age limit",
                )


@dataclass
class TableConfig:
    """One embedding table: `rows` x `dim`, looked up by the sparse features in `features`."""

    name: str = MISSING
    """The table's name, unique among the model's tables (sharding.per_table and the plan name it)."""
    rows: int = MISSING
    """Rows of the table: its features' ids lie in [0, rows)."""
    dim: int = MISSING
    """Embedding dimension, a multiple of 4 (fbgemm's kernels). With interaction=dot the same for every
    table and equal to the last size of model.bottom_mlp (dot products need one width); with dcn any
    (the cross net's input is the concatenation of the bottom MLP's output, if any, and every feature's
    vector)."""
    features: list[str] = MISSING
    """The sparse features looked up in this table (a feature in one table only)."""
    pooling: float = 1
    """Mean ids per sample of each feature (the pooling factor): the planner's and the cost model's
    figure. The synthetic data draws exactly that many ids per sample, so with data.source=synthetic
    it is a whole number; `dlrm.data.inspect` measures it on Parquet data (e.g. 1.46). How the ids'
    rows combine is `pooling_type`."""
    pooling_type: PoolingType = PoolingType.sum
    """How a feature's ids' rows combine into one vector: sum or mean (TorchRec's PoolingType, which
    the lookup kernels apply). A mean-pooled table is never sharded row_wise, table_row_wise or
    grid_shard (TorchRec's mean over a bag split by rows also divides the other tables' features)."""
    sharding: ShardingType | None = None
    """Pins this table's sharding type (below sharding.per_table, above sharding.strategy); None: the
    strategy decides."""
    vocabulary: VocabularyConfig = field(default_factory=VocabularyConfig)
    """How raw ids map to rows: directly (policy: none), or through a managed vocabulary of `rows` rows
    (see VocabularyConfig and docs/vocabularies.md)."""

    def check(self, key: str) -> None:
        if not self.name:
            _fail(f"{key}.name", self.name, "give each table a unique, non-empty name")
        _require_positive(f"{key}.rows", self.rows)
        _require_positive(f"{key}.dim", self.dim)
        if self.dim % 4:
            _fail(
                f"{key}.dim",
                self.dim,
                f"fbgemm's embedding kernels need a multiple of 4; use {self.dim + 4 - self.dim % 4}",
            )
        _require_positive(f"{key}.pooling", self.pooling)
        if not self.features:
            _fail(f"{key}.features", list(self.features), "list the sparse features this table serves")
        self.vocabulary.check(f"{key}.vocabulary", self.rows)


TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a task's name is part of metric keys and TensorBoard tags


@dataclass
class TaskConfig:
    """One binary label predicted by the model: its logit, and its weight in the loss."""

    name: str = MISSING
    """The task's name (letters, digits, `_`, `.`, `-`): its metric keys (eval_auc/<name>, ...) and, with
    several tasks, the label it names."""
    weight: float = 1.0
    """Its weight in the loss: loss = sum over tasks of weight * mean binary cross-entropy."""

    def check(self, key: str) -> None:
        if not TASK_NAME.fullmatch(self.name or ""):
            _fail(f"{key}.name", self.name, "name the task with letters, digits, '_', '.' or '-'")
        _require_positive(f"{key}.weight", self.weight)


@dataclass
class ModelConfig:
    """DLRM: bottom MLP over dense features, embedding tables, interaction, top MLP -> one logit per task."""

    interaction: Interaction = Interaction.dot
    """How the bottom MLP's output and the pooled embeddings are combined: dot (pairwise dot products)
    or dcn (TorchRec's DLRM-DCN: a low-rank cross net)."""
    dense_in_features: int = 13
    """Dense features per sample (Criteo has 13): the bottom MLP's input width. 0: categorical features
    only (e.g. Avazu-like data), no bottom MLP (bottom_mlp: []): the interaction takes the pooled
    embeddings alone (dot: their pairwise dot products; dcn: the cross net over their concatenation)."""
    bottom_mlp: list[int] = field(default_factory=lambda: [64, 16])
    """Layer sizes of the MLP over the dense features; with interaction=dot the last equals the embedding
    dim (with dcn any). Empty exactly when dense_in_features is 0."""
    top_mlp: list[int] = field(default_factory=lambda: [64, 32, 1])
    """Layer sizes of the MLP over the interaction's output; the last is the number of tasks (one logit
    each: 1 for one task)."""
    tasks: list[TaskConfig] = field(default_factory=lambda: [TaskConfig(name="label", weight=1.0)])
    """The binary labels the model predicts, in the order of its logits and of the labels' columns
    (one task: labels [B]; T tasks: labels [B, T]). The loss is the weighted sum of the tasks' mean
    binary cross-entropies."""
    dcn_num_layers: int = 3
    """Cross layers of the DCN interaction (interaction=dcn only)."""
    dcn_low_rank_dim: int = 64
    """Rank of each DCN cross layer's low-rank weight (interaction=dcn only)."""
    tables: list[TableConfig] = field(default_factory=list)
    """The embedding tables (model=dlrm_small fills them for the default job)."""
    weighted: bool = False
    """Whether the tables take a weight per id (TorchRec's weighted EmbeddingBagCollection,
    `is_weighted`): a bag is then sum_i w_i * row(id_i), so every table pools by sum (torch's
    EmbeddingBag takes weights with sum only). The weights come from the data
    (data.parquet.sparse[*].weights); a feature without declared weights gets 1.0 per id. false: the
    ids' rows are pooled as they are."""
    embedding_precision: Precision = Precision.fp32
    """The dtype the table weights are stored in (fp32 or fp16): TorchRec's
    `EmbeddingBagConfig.data_type`, which fbgemm's kernels take as `weights_precision` and TorchRec's
    planner as the bytes per weight. fp16 halves the tables' memory; the lookups' outputs and the
    optimizer state stay fp32, and fbgemm rounds each update stochastically. The weights are part of
    the model (its state dict, checkpoints, exports), hence a model key. bf16 is refused: fbgemm 1.8's
    training kernels (CPU and CUDA) have no bf16 weight type."""

    def check(self, key: str = "model") -> None:
        self._check_dense(key)
        for mlp in ("bottom_mlp", "top_mlp"):
            sizes = getattr(self, mlp)
            if not sizes and mlp == "top_mlp":
                _fail(f"{key}.{mlp}", list(sizes), "list at least one layer size")
            for i, size in enumerate(sizes):
                _require_positive(f"{key}.{mlp}[{i}]", size)
        if not self.tasks:
            _fail(f"{key}.tasks", [], "list at least one task, e.g. [{name: label, weight: 1.0}]")
        task_names: set = set()
        for i, task in enumerate(self.tasks):
            task.check(f"{key}.tasks[{i}]")
            if task.name in task_names:
                _fail(f"{key}.tasks[{i}].name", task.name, "give each task a unique name")
            task_names.add(task.name)
        if self.top_mlp[-1] != len(self.tasks):
            _fail(
                f"{key}.top_mlp",
                list(self.top_mlp),
                f"the last layer must have size {len(self.tasks)}, one logit per task of model.tasks "
                f"(use {[*self.top_mlp[:-1], len(self.tasks)]})",
            )
        if self.interaction == Interaction.dcn:
            _require_positive(f"{key}.dcn_num_layers", self.dcn_num_layers)
            _require_positive(f"{key}.dcn_low_rank_dim", self.dcn_low_rank_dim)
        self._check_tables(key)
        if self.interaction == Interaction.dcn:
            return  # the cross net takes the concatenation: any widths
        dims = {t.dim for t in self.tables}
        if len(dims) > 1:
            _fail(
                f"{key}.tables[*].dim",
                sorted(dims),
                "the dot interaction needs one embedding dim for all tables: give every table the same dim, "
                "or use model.interaction=dcn, whose cross net takes tables of different dims",
            )
        if not self.bottom_mlp and sum(len(t.features) for t in self.tables) < 2:
            _fail(
                f"{key}.tables",
                [t.name for t in self.tables],
                "with no dense features the dot interaction needs at least two sparse features (it multiplies "
                "pairs of them): add a feature, or use model.interaction=dcn",
            )
        if self.bottom_mlp and self.bottom_mlp[-1] != self.tables[0].dim:
            _fail(
                f"{key}.bottom_mlp",
                list(self.bottom_mlp),
                f"its last size must equal the embedding dim {self.tables[0].dim}, since the interaction combines them",
            )

    def _check_dense(self, key: str) -> None:
        """dense_in_features >= 0, and a bottom MLP exactly when there are dense features."""
        if self.dense_in_features < 0:
            _fail(f"{key}.dense_in_features", self.dense_in_features, "use 0 (no dense features) or a positive count")
        if self.dense_in_features == 0 and self.bottom_mlp:
            _fail(
                f"{key}.bottom_mlp",
                list(self.bottom_mlp),
                "with model.dense_in_features=0 there is nothing for a bottom MLP to take: set model.bottom_mlp=[]",
            )
        if self.dense_in_features > 0 and not self.bottom_mlp:
            _fail(f"{key}.bottom_mlp", [], "list at least one layer size (or set model.dense_in_features=0)")

    def _check_tables(self, key: str) -> None:
        """At least one table; unique table names; each feature in one table; sum pooling when weighted."""
        if not self.tables:
            _fail(f"{key}.tables", [], "list at least one embedding table")
        mean = [i for i, t in enumerate(self.tables) if t.pooling_type == PoolingType.mean]
        if self.weighted and mean:
            _fail(
                f"{key}.tables[{mean[0]}].pooling_type",
                "mean",
                f"with {key}.weighted=true every table pools by sum (torch's EmbeddingBag takes per-id weights "
                "with sum only): use pooling_type=sum, or set model.weighted=false",
            )
        names: set = set()
        features: set = set()
        for i, t in enumerate(self.tables):
            t.check(f"{key}.tables[{i}]")
            if t.name in names:
                _fail(f"{key}.tables[{i}].name", t.name, "give each table a unique, non-empty name")
            names.add(t.name)
            for f in t.features:
                if f in features:
                    _fail(f"{key}.tables[{i}].features", f, "a feature may be looked up in one table only")
                features.add(f)
